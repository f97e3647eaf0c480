#!/usr/bin/env bash
# The main job (`make main`): the verdict where users run first (the quick scenario suite:
# the Azure conversation trace on a simulated H100 at vLLM's own H100 defaults, every load
# against stock's measured capacity), then a short sanity check on the real CPU engine.
set -euo pipefail
cd "$(dirname "$0")/.."

FS=.venv/bin/fairsched
OUT=runs/main
start=$(date +%s)
minutes() { echo "$(( ($(date +%s) - start) / 60 )) min"; }

echo "[main 1/2] quick scenario suite (simulated H100, Qwen3-8B, Azure conversation trace,"
echo "           async engine, 5 loads against stock's capacity; about 5 minutes)"
"$FS" suite --quick --out "$OUT/suite"

echo "[main 2/2] sanity check on the real vLLM CPU engine after $(minutes): a tiny random "
echo "           model on 2 cores, 200 ShareGPT requests, stock against the default, two "
echo "           rounds. It shows the plugin serves through a real server; its timings are "
echo "           too noisy on 2 cores to judge a policy by (the suite above is the verdict)."
"$FS" bench --arms stock,guarded-srpf --workload uniform --num-requests 200 \
  --param rate_per_s=10 --rate-scale 4.5 --max-output-tokens 128 --repeat 2 \
  --pool .cache/sharegpt-pool.jsonl --out "$OUT/cpu-engine"

echo "main job done in $(minutes)"
echo "  verdict: $OUT/suite/suite.md (plots in $OUT/suite/plots/, data in $OUT/suite/results.json)"
echo "  CPU-engine sanity check: $OUT/cpu-engine/report.md"
