# The two commands of the README: `make main` (set up, then the main job) and `make test`.
.PHONY: setup main test demo bench-overhead

# The main job: FCFS against the default Aging on a ShareGPT workload that makes the CPU
# engine queue (300 requests, 40 req/s, prefill budget 256), two interleaved repeats.
MAIN_BENCH = --arms fcfs,aging --workload sharegpt_fixed_gap --num-requests 300 \
	--param gap_s=0.025 --max-output-tokens 128 --repeat 2 --pool .cache/sharegpt-pool.jsonl

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
