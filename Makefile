# The two commands of the README: `make main` (set up, then the main job) and `make test`.
.PHONY: setup main test demo bench-overhead

# The main job: stock vLLM, the plugin's fcfs (vLLM's own order, the control) and the
# default policy on ShareGPT with Poisson arrivals at three loads for the CPU engine
# (15, 45 and 80 req/s: light, moderate, heavy; 300 requests, prefill budget 256), three
# interleaved repeats, each case replayed by the project's client and by vllm bench serve.
MAIN_BENCH = --arms stock,fcfs,guarded-aging --workload uniform --num-requests 300 \
	--param rate_per_s=10 --rate-scale 1.5,4.5,8 --max-output-tokens 128 --repeat 3 \
	--vllm-bench --pool .cache/sharegpt-pool.jsonl

setup:
	bash scripts/setup.sh

main: setup
	.venv/bin/fairsched bench $(MAIN_BENCH) --out runs/main

test: setup
	.venv/bin/python -m pytest

demo: setup
	.venv/bin/fairsched demo

bench-overhead: setup
	.venv/bin/python benchmarks/schedule_overhead.py
