# The two commands of the README: `make main` (set up, then the main job) and `make test`.
.PHONY: setup main test demo bench-overhead

# The main job (scripts/main_job.sh): the quick scenario suite (the verdict at GPU scale on
# a production trace, simulated) and then a short sanity check on the real CPU engine.

setup:
	bash scripts/setup.sh

main: setup
	bash scripts/main_job.sh

test: setup
	.venv/bin/python -m pytest

demo: setup
	.venv/bin/fairsched demo

bench-overhead: setup
	.venv/bin/python benchmarks/schedule_overhead.py
