"""Time what LPRS + APC add to FairScheduler.schedule() over the same scheduler without
them, on the same workload.

The real vLLM scheduler with fake model outputs (no model), sync scheduling as on the CPU
engine, a 512-token budget, and ``N`` prompts kept in prefill (one that finishes is
replaced), so every step has ``N`` prefill candidates. Each scenario runs two arms of the
same Aging scheduler, ``off`` (LPRS and APC off: the token-budget rule) and ``on`` (LPRS
and APC on, with the online bias as by default, so each step also predicts the dispatched
batch), their steps interleaved, each first in turn, so that machine noise and the position
in the round hit both alike, in one run.

The latency model is an MLP of the trained model's shape (16-128-64-32-1, ONNX Runtime on
one thread) with positive weights: ONNX Runtime's cost does not depend on the weights, and
every prediction is then a positive time, so the targets below decide the chunks exactly as
each scenario says. (The CPU engine's model, served by this fake scheduler whose KV cache
is far outside its profile, predicts negative times for some batches, and LPRS would fall
back instead; the last column shows no scenario did.)

* ``8 active, target not binding``: 8 prompts of 64 tokens, a target above any prediction,
  APC's defaults. Both arms schedule the same 8 x 64 tokens, so the difference is LPRS and
  APC's own work: the common case, where every candidate takes what the token budget
  gives it and one predictor call scores all of them.
* ``8 active, every chunk cut``: 8 prompts of 8,000 tokens, a target below any prediction
  and APC's minimum chunk at 1, so every candidate LPRS scores overflows and takes 1 token:
  all 8 candidates scored over their whole candidate sets (136 rows). ``off`` schedules one
  512-token chunk, ``on`` eight 1-token chunks, so the difference also holds vLLM's own
  work for seven more scheduled requests.
* ``64 candidates, cap 8``: the same with 64 prompts; APC's default cap of 8 active
  prefills holds the 9th back, and that waiting request ends admissions for the step.
* ``64 candidates, all active``: the same with the cap at 64, so all 64 are scored and
  active: the worst case of all.

The guard against a mismatched predictor is off: these fake steps take no time, and it
would (rightly) stop trusting the model. Figures are medians of per-step times in
microseconds; "added" is ``on``'s median minus ``off``'s, and the ratio ``on`` over
``off``. Each step is timed twice: the scheduling thread's CPU time, which a busy machine
inflates less (time the thread waits for a core is not counted), and wall time.

    .venv/bin/python -m benchmarks.lprs_overhead
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fairsched_plugin import FairScheduler
from fairsched_plugin.sim.fake_engine import (
    OfflineEngine,
    make_request,
    make_scheduler,
    write_config_only_model,
)
from fairsched_plugin.predictor.export import export_onnx, model_metadata
from fairsched_plugin.predictor.features import NUM_FEATURES
from fairsched_plugin.predictor.train import LatencyMLP

BUDGET = 512

# label, candidates, prompt tokens, LPRS target (ms), APC cap, APC minimum chunk
SCENARIOS = (
    ("8 active, target not binding", 8, 64, 1e12, 8, 16),
    ("8 active, every chunk cut", 8, 8000, 1e-9, 8, 1),
    ("64 candidates, cap 8", 64, 8000, 1e-9, 8, 1),
    ("64 candidates, all active", 64, 8000, 1e-9, 64, 1),
)


def positive_mlp(path: Path) -> Path:
    """The default-shape latency MLP with positive weights: positive times for every batch,
    scaled to microseconds so that the online bias, following the fake steps' measured
    times (tenths of a millisecond), stays positive too."""
    torch.manual_seed(0)
    model = LatencyMLP((128, 64, 32), 0.0, np.zeros(NUM_FEATURES), np.ones(NUM_FEATURES),
                       0.0, 1e-9)
    with torch.no_grad():
        for parameter in model.net.parameters():
            parameter.abs_()
    return export_onnx(model, path, model_metadata(
        memory_provider="kv_cache", vllm_version="", hardware="", training={}))


class Arm:
    """One scheduler kept at ``candidates`` prompts in prefill."""

    def __init__(self, model_dir: Path, config: dict[str, Any], candidates: int,
                 prompt: int) -> None:
        scheduler = make_scheduler(
            FairScheduler, model_dir, max_num_seqs=candidates, max_num_batched_tokens=BUDGET,
            num_blocks=200_000, async_scheduling=False,
            additional_config={"fairsched": config},
        )
        self.engine = OfflineEngine(scheduler)
        self.candidates = candidates
        self.prompt = prompt
        self.added = 0
        self.times: list[int] = []
        self.cpu_times: list[int] = []
        self.scheduled: list[int] = []
        self.records: list[dict[str, Any]] = []
        self._top_up()

    def step(self) -> None:
        engine = self.engine
        start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
        record = engine.schedule()
        self.cpu_times.append(time.thread_time_ns() - cpu_start)
        self.times.append(time.perf_counter_ns() - start)
        self.scheduled.append(len(record.output.num_scheduled_tokens))
        rule = engine.scheduler._chunk_rule
        if rule is not None:
            self.records.append(rule.step_record())
        while len(engine._queue) >= engine.in_flight:
            engine.complete_oldest()
        self._top_up()

    def reset(self) -> None:
        self.times.clear()
        self.cpu_times.clear()
        self.scheduled.clear()
        self.records.clear()

    def _top_up(self) -> None:
        requests = self.engine.scheduler.requests.values()
        prefilling = sum(1 for r in requests if r.num_computed_tokens < r.num_prompt_tokens)
        fresh = [make_request(f"r{self.added + i}", self.prompt, 1,
                              arrival_time=float(self.added + i))
                 for i in range(self.candidates - prefilling)]
        self.engine.add(fresh)
        self.added += len(fresh)

    def median_us(self, cpu: bool) -> float:
        return statistics.median(self.cpu_times if cpu else self.times) / 1e3

    def mean_of(self, field: str) -> float:
        return statistics.fmean(record[field] for record in self.records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    model_dir = write_config_only_model(tmp / "model")
    model = positive_mlp(tmp / "positive.onnx")
    off = {"policy": "aging", "aging": {"alpha": 37.5}}
    print(f"schedule() per step, medians of {args.steps} interleaved steps after "
          f"{args.warmup} (budget {BUDGET} tokens, granularity 32); CPU time of the "
          "scheduling thread, and wall time\n")
    print("| scenario | requests scheduled off / on | off us | on us | added us | ratio "
          "| wall: added us | ratio | predictor calls | rows scored | fallback steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, candidates, prompt, target_ms, cap, min_chunk in SCENARIOS:
        on = {
            **off,
            "predictor": {"path": str(model)},
            "lprs": {"enabled": True, "target_ms": target_ms, "guard_window": 0},
            "apc": {"enabled": True, "max_active_prefills": cap, "min_chunk": min_chunk},
        }
        arms = [Arm(model_dir, config, candidates, prompt) for config in (off, on)]
        for _ in range(args.warmup):
            for arm in arms:
                arm.step()
        for arm in arms:
            arm.reset()
        for step in range(args.steps):
            # The arm stepped first in a round has run a few percent slower than the
            # same arm stepped later (not in every run), so the two take turns.
            for arm in (arms if step % 2 == 0 else arms[::-1]):
                arm.step()
        base, lprs = arms
        us_off, us_on = base.median_us(cpu=True), lprs.median_us(cpu=True)
        wall_off, wall_on = base.median_us(cpu=False), lprs.median_us(cpu=False)
        print(f"| {label} | {statistics.median(base.scheduled):.0f} / "
              f"{statistics.median(lprs.scheduled):.0f} | {us_off:.1f} | {us_on:.1f} "
              f"| {us_on - us_off:+.1f} | {us_on / us_off:.2f} "
              f"| {wall_on - wall_off:+.1f} | {wall_on / wall_off:.2f} "
              f"| {lprs.mean_of('lprs_calls'):.2f} | {lprs.mean_of('lprs_rows'):.0f} "
              f"| {sum(r['lprs_fallback'] for r in lprs.records)} |",
              flush=True)


if __name__ == "__main__":
    main()
