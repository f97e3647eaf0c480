# The two commands of the README: `make main` (set up, then the main job) and `make test`.
.PHONY: setup main test bench-overhead

setup:
	bash scripts/setup.sh

main: setup
	.venv/bin/fairsched demo

test: setup
	.venv/bin/python -m pytest

bench-overhead: setup
	.venv/bin/python benchmarks/schedule_overhead.py
