#!/usr/bin/env bash
# The environment-only switch, for deployments whose command line is fixed (e.g. an
# Ascend image): no --scheduler-cls; the plugin's entry point routes vLLM to FairScheduler.
# Usage: examples/serve_with_env_only.sh MODEL [extra vLLM arguments...]
set -euo pipefail
model=${1:?usage: $0 MODEL [vLLM arguments...]}
shift
export FAIRSCHED_POLICY=guarded-srpf   # the default policy
export FAIRSCHED_CONFIG="$(dirname "$0")/fairsched.json"
exec python -m vllm.entrypoints.openai.api_server --model "$model" "$@"
