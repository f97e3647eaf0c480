"""Time FairScheduler.schedule() against vLLM's stock AsyncScheduler.

Every arm runs the same fake-output workload (the real vLLM scheduler, KV-cache manager and
``update_from_output``; no model) with 100, 1,000 and 10,000 requests waiting. Steps of the
arms are interleaved, in an order that rotates every round, so machine noise and the
position in the round hit them alike; figures are ratios of medians measured in this one
run. Target: at most 1.05x stock at 100, 1,000 and 10,000 waiting.

Four workloads, because a policy changes what the scheduler has to do:

* ``uniform``: every prompt 1,024 tokens, every output 32. Every policy then makes the same
  decisions as stock, so the ratio is the adapter's own overhead (plan, hook, heap).
* ``decodes``: 32-token prompts with 2,000-token outputs and ``max_num_seqs`` 256, so
  about 250 decodes run every step beside the waiting queue, as under heavy load on a real
  server: the per-running-request cost of the adapter shows here.
* ``prefills``: 8,000-token prompts and vLLM's long-prefill threshold at 64 tokens, so 8
  partial prefills share every step (100 and 1,000 waiting): LPRS and APC's cost per step
  where they have the most to decide. The target there is at most 100 us more than stock
  per step, printed as ``+us``.
* ``mixed``: prompts 16-3,000 tokens. Shortest-first policies admit short prompts first,
  so their batches hold more decodes and vLLM's own loop does more work per step; the fair
  comparison is the time per request scheduled in the step, printed as ``per req``.

With ``--full-step`` the time is the whole engine step of the fake engine, ``schedule()``
plus ``update_from_output`` for the outputs it waits on, which is where the per-step trace
is written (the ``traced`` arm: the default with the trace ``fairsched bench`` writes).

    .venv/bin/python benchmarks/schedule_overhead.py [--steps 400] [--instances 3] [--full-step]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from fairsched_plugin import FairScheduler
from fairsched_plugin.config import FairschedConfig
from fairsched_plugin.sim.fake_engine import (
    OfflineEngine,
    make_request,
    make_scheduler,
    write_config_only_model,
)

SIZES = (100, 1_000, 10_000)


DEFAULT = FairschedConfig().policy
ARMS = {
    "stock": (AsyncScheduler, {}),
    "fcfs": (FairScheduler, {"policy": "fcfs"}),
    # The default: its guard counts every step's prefill work (StepMonitor) and watches
    # its tail; LPRS and APC are off without a fitted latency model.
    "default": (FairScheduler, {"policy": DEFAULT}),
    # The default's order without the tail watch.
    "no-watch": (FairScheduler, {"policy": DEFAULT, "guarded_srpf": {"tail_window": 0}}),
    # LPRS and APC on the built-in model's H100 preset: LPRS plans from the first step
    # (its guard off: the fake steps' microseconds would otherwise make it fall back).
    "lprs-apc-h100": (FairScheduler, {"policy": DEFAULT,
                                      "lprs": {"enabled": True, "guard_window": 0},
                                      "apc": {"enabled": True},
                                      "predictor": {"model": "qwen3-8b", "device": "h100"}}),
    "guarded-aging": (FairScheduler, {"policy": "guarded-aging"}),
    "aging": (FairScheduler, {"policy": "aging", "aging": {"alpha": 37.5}}),
    # The automatic alpha also times every step to measure prefill speed.
    "auto": (FairScheduler, {"policy": "aging", "aging": {"alpha": "auto"}}),
    # The default with the JSON Lines trace (its path is set in main()).
    "traced": (FairScheduler, {"policy": DEFAULT}),
    # Every arm above counts for the fairsched: metrics (on by default); these do not.
    "fcfs-nometrics": (FairScheduler, {"policy": "fcfs", "metrics": {"enabled": False}}),
    "default-nometrics": (FairScheduler, {"policy": DEFAULT, "metrics": {"enabled": False}}),
}


def _engine(
    cls, model_dir: Path, config: dict, waiting: int, workload: str
) -> OfflineEngine:
    scheduler = make_scheduler(
        cls,
        model_dir,
        max_num_seqs=256,
        max_num_batched_tokens=512,
        num_blocks=200_000,
        async_scheduling=True,
        additional_config={"fairsched": config},
        # ``prefills``: vLLM's long-prefill threshold shares the budget among 8 prompts.
        long_prefill_token_threshold=64 if workload == "prefills" else 0,
    )
    engine = OfflineEngine(scheduler)
    rng = random.Random(waiting)
    for i in range(waiting):
        if workload == "uniform":
            prompt, output = 1024, 32
        elif workload == "decodes":
            prompt, output = 32, 2000
        elif workload == "prefills":
            prompt, output = 8000, 4
        else:
            prompt, output = rng.randint(16, 3000), rng.randint(8, 64)
        engine.add([make_request(f"r{i}", prompt, output, arrival_time=i * 1e-3)])
    return engine


def _timed_step(engine: OfflineEngine, full_step: bool) -> tuple[int, int]:
    """Nanoseconds spent in ``schedule()`` (with ``full_step``, also in completing the
    outputs it waits on) for one engine step, and requests scheduled."""
    start = time.perf_counter_ns()
    record = engine.schedule()
    elapsed = time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    while len(engine._queue) >= engine.in_flight:
        engine.complete_oldest()
    if full_step:
        elapsed += time.perf_counter_ns() - start
    return elapsed, len(record.output.num_scheduled_tokens)


def measure(model_dir: Path, waiting: int, steps: int, workload: str,
            full_step: bool, instances: int) -> dict[str, dict]:
    """Per arm: the median over its ``instances`` engines of each engine's median step
    time (and time per request scheduled), and the range over the engines."""
    engines = [
        (name, _engine(cls, model_dir, config, waiting, workload))
        for _ in range(instances)
        for name, (cls, config) in ARMS.items()
    ]
    samples: list[list[tuple[int, int]]] = [[] for _ in engines]
    order = list(range(len(engines)))
    for step in range(steps):
        # The engine stepped first in a round has run up to 5% slower than the same arm
        # stepped later (not in every run: benchmarks/overhead_harness.py position), so
        # the order rotates every round.
        shift = step % len(order)
        for i in order[shift:] + order[:shift]:
            samples[i].append(_timed_step(engines[i][1], full_step))
    per_engine: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ARMS}
    for (name, _built), values in zip(engines, samples):
        per_engine[name].append((
            statistics.median(ns for ns, _n in values) / 1e3,
            statistics.median(ns / max(n, 1) for ns, n in values) / 1e3,
            statistics.fmean(n for _ns, n in values),
        ))
    return {
        name: {
            "step_us": statistics.median(step for step, _r, _n in rows),
            "step_us_range": (min(step for step, _r, _n in rows),
                              max(step for step, _r, _n in rows)),
            "per_request_us": statistics.median(req for _s, req, _n in rows),
            "scheduled": statistics.fmean(n for _s, _r, n in rows),
        }
        for name, rows in per_engine.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--instances", type=int, default=3,
                        help="engines per arm (the same arm's engines differ by a few "
                             "percent: layout, not decisions)")
    parser.add_argument("--full-step", action="store_true",
                        help="time schedule() plus update_from_output, not schedule() alone")
    parser.add_argument("--arms", default=",".join(name for name in ARMS if name != "stock"),
                        help="comma-separated arms to time against stock (default: all): "
                             + ", ".join(ARMS))
    args = parser.parse_args()
    chosen = args.arms.split(",")
    unknown = sorted(set(chosen) - set(ARMS))
    if unknown:
        parser.error(f"no such arm: {', '.join(unknown)}")
    for name in [name for name in ARMS if name != "stock" and name not in chosen]:
        del ARMS[name]
    scratch = Path(tempfile.mkdtemp())
    model_dir = write_config_only_model(scratch / "model")
    if "traced" in ARMS:
        ARMS["traced"][1]["trace_path"] = str(scratch / "trace.jsonl")
    for _cls, config in ARMS.values():
        config.setdefault("metrics", {}).setdefault("dir", str(scratch / "metrics"))
    arms = [name for name in ARMS if name != "stock"]
    timed = "one engine step" if args.full_step else "schedule() per call"
    print(f"{timed}, medians over {args.steps} interleaved steps of {args.instances} engines "
          "per arm (budget 512 tokens, max_num_seqs 256); x = ratio of the arm's median "
          f"engine to stock's, (range over its engines); default = {DEFAULT}, "
          "aging = alpha 37.5, auto = alpha auto, traced = the default writing the per-step "
          "trace")
    print(f"{'workload':>8} {'waiting':>7} {'stock us':>9} {'stock range':>11} "
          + " ".join(f"{name + ' x':>17}" for name in arms)
          + f" {'reqs/step':>9} " + " ".join(f"{name + ' per req':>15}" for name in arms))
    for workload in ("uniform", "decodes", "mixed", "prefills"):
        for waiting in (SIZES if workload != "prefills" else SIZES[:2]):
            m = measure(model_dir, waiting, args.steps, workload, args.full_step,
                        args.instances)
            stock = m["stock"]["step_us"]

            def spread(name: str) -> str:
                low, high = m[name]["step_us_range"]
                return f"({low / stock:.2f}-{high / stock:.2f})"

            def ratios(name: str) -> str:
                return f"{m[name]['step_us'] / stock:.2f} {spread(name)}"

            print(
                f"{workload:>8} {waiting:>7} {stock:>9.1f} {spread('stock'):>11} "
                + " ".join(f"{ratios(name):>17}" for name in arms)
                + f" {m['stock']['scheduled']:>9.0f} "
                + " ".join(f"{m[name]['per_request_us'] / m['stock']['per_request_us']:>15.2f}"
                           for name in arms),
                flush=True,
            )
            if workload == "prefills":
                print(" " * 17 + "+us per step: " + ", ".join(
                    f"{name} {m[name]['step_us'] - stock:+.0f}" for name in arms), flush=True)

if __name__ == "__main__":
    main()
