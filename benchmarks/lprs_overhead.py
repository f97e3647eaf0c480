"""Time what LPRS + APC add to FairScheduler.schedule() over Aging alone.

The real vLLM scheduler with fake model outputs (no model), ``N`` long prompts all
prefilling, so every step has ``N`` prefill candidates (8 and 64 here). LPRS scores each
candidate's chunk sizes with one ONNX Runtime call on the given latency model; the target
is set low so that every candidate gets a small chunk. Two LPRS + APC arms:

* ``all``: APC's cap at 64 and minimum chunk 1, so all ``N`` candidates are scored every
  step (the worst case);
* ``cap 8``: APC's default cap of 8 active prefills; once it is reached the remaining
  candidates are held back without a prediction.

Steps of the arms are interleaved so machine noise hits them alike; figures are medians
from this one run.

    .venv/bin/python benchmarks/lprs_overhead.py --model docs/predictor-cpu/model.onnx
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fairsched_plugin import FairScheduler
from fairsched_plugin.adapter.offline import (
    OfflineEngine,
    make_request,
    make_scheduler,
    write_config_only_model,
)

CANDIDATES = (8, 64)
BUDGET = 512


def _engine(model_dir: Path, config: dict, candidates: int) -> OfflineEngine:
    scheduler = make_scheduler(
        FairScheduler, model_dir, max_num_seqs=candidates, max_num_batched_tokens=BUDGET,
        num_blocks=200_000, async_scheduling=True, additional_config={"fairsched": config},
    )
    engine = OfflineEngine(scheduler)
    engine.add([make_request(f"r{i}", 8000, 4, arrival_time=i * 1e-3)
                for i in range(candidates)])
    return engine


def _timed_step(engine: OfflineEngine) -> int:
    start = time.perf_counter_ns()
    engine.schedule()
    elapsed = time.perf_counter_ns() - start
    while len(engine._queue) >= engine.in_flight:
        engine.complete_oldest()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="ONNX latency model")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--granularity", type=int, default=32)
    args = parser.parse_args()
    model_dir = write_config_only_model(Path(tempfile.mkdtemp()) / "model")
    aging = {"policy": "aging", "aging": {"alpha": 37.5}}
    lprs = {
        **aging,
        "predictor": {"path": str(args.model.resolve()), "allow_memory_mismatch": True},
        "lprs": {"enabled": True, "target_ms": 0.001, "granularity": args.granularity},
    }
    arms = {
        "aging": aging,
        "all": {**lprs, "apc": {"enabled": True, "max_active_prefills": 64, "min_chunk": 1}},
        "cap 8": {**lprs, "apc": {"enabled": True, "max_active_prefills": 8, "min_chunk": 1}},
    }
    print(f"schedule() per call, medians over {args.steps} interleaved steps "
          f"(budget {BUDGET} tokens, granularity {args.granularity}); added = over aging")
    print(f"{'candidates':>10} {'aging us':>9} {'all: us':>9} {'added':>8} {'rows':>5} "
          f"{'cap 8: us':>10} {'added':>8} {'rows':>5}")
    for n in CANDIDATES:
        engines = {name: _engine(model_dir, config, n) for name, config in arms.items()}
        samples: dict[str, list[int]] = {name: [] for name in engines}
        rows: dict[str, list[int]] = {name: [] for name in engines if name != "aging"}
        for _ in range(args.steps):
            for name, engine in engines.items():
                samples[name].append(_timed_step(engine))
            for name in rows:
                rows[name].append(engines[name].scheduler._chunk_rule.step_record()[
                    "lprs_candidates"])
        us = {name: statistics.median(values) / 1e3 for name, values in samples.items()}
        cells = " ".join(
            f"{us[name]:>9.1f} {us[name] - us['aging']:>8.1f} {statistics.fmean(rows[name]):>5.0f}"
            for name in rows
        )
        print(f"{n:>10} {us['aging']:>9.1f} {cells}", flush=True)


if __name__ == "__main__":
    main()
