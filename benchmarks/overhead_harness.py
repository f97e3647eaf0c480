"""Checks of the schedule() timing harness itself, and of where the default's time goes.

``benchmarks/schedule_overhead.py`` compares arms whose cost differs by a few percent, so
the harness's own biases matter at that scale. Each check here uses the same fake engine
(``uniform`` workload, 1,024-token prompts) and prints ratios of median step times
measured in one run:

* ``position``: four stock engines stepped in a fixed order, then four in an order that
  rotates every round; each engine against the first. A fixed order puts a bias on the
  engine stepped first.
* ``aa``: stock, an empty subclass of vLLM's scheduler, one whose ``schedule()`` only
  calls vLLM's, and ``fcfs``, each on ``--instances`` engines, rotating: how far apart
  arms that do stock's work measure.
* ``knockouts``: the default with one of its per-step pieces switched off (the step
  monitor, the whole plan, the plan's skip check answering "skip"), rotating. On uniform
  prompts no knock-out changes a decision, so the difference to the default is that
  piece's cost. Measurement only: a knocked-out scheduler is not a valid scheduler.
* ``rekey``: one re-key of the default's waiting queue (what a move of the automatic
  alpha costs, on the engine's path; ``hrrn`` re-keys every step), after 50 steps, the
  alpha alternating between two values so the heap is rebuilt in earnest: the median of
  22 re-keys in milliseconds, and per waiting request in microseconds.
* ``arms``: the arms named by ``--arms`` (names of ``schedule_overhead.ARMS``), rotating,
  so that an older package can be timed the same way: copy this file and
  ``schedule_overhead.py`` into an exported tree and run the module from there. With
  ``--before DIR`` (a directory holding an exported ``fairsched_plugin`` package) each
  plugin arm also runs on that package, in the same process and rotation, as
  ``NAME (before)``: a change is then measured in one run, not across runs minutes apart.

    .venv/bin/python -m benchmarks.overhead_harness position
    .venv/bin/python -m benchmarks.overhead_harness aa --waiting 1000
    .venv/bin/python -m benchmarks.overhead_harness knockouts --waiting 1000
    .venv/bin/python -m benchmarks.overhead_harness rekey --waiting 1000,10000
    .venv/bin/python -m benchmarks.overhead_harness arms --arms stock,fcfs,default --waiting 1000,10000
    git archive HEAD~1 fairsched_plugin | tar -x -C /tmp/before
    .venv/bin/python -m benchmarks.overhead_harness arms --arms stock,default --before /tmp/before
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from fairsched_plugin.sim.fake_engine import OfflineEngine, write_config_only_model

from .schedule_overhead import ARMS, _engine, _timed_step


class EmptySubclass(AsyncScheduler):
    """vLLM's scheduler under another class: the A/A arm."""


class WrappingSubclass(AsyncScheduler):
    """vLLM's scheduler with a ``schedule()`` that only calls it, as the plugin's does."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return super().schedule(*args, **kwargs)


def _knock_out(piece: str) -> Callable[[Any], None]:
    def monitor(scheduler: Any) -> None:
        scheduler._steps = None

    def plan(scheduler: Any) -> None:
        scheduler._plan_step = lambda views, throttle_prefills=False: None

    def check(scheduler: Any) -> None:
        scheduler._running_order_is_plan_order = lambda *args: True

    return {"monitor": monitor, "plan": plan, "check": check}[piece]


Builder = Callable[[], OfflineEngine]


def load_before(exported: Path) -> type:
    """The ``FairScheduler`` of the package exported in ``exported``, imported under the
    name ``fairsched_before`` (the scheduler's modules import each other relatively), so
    that it runs beside this package in one process."""
    home = Path(tempfile.mkdtemp())
    shutil.copytree(exported / "fairsched_plugin", home / "fairsched_before")
    sys.path.insert(0, str(home))
    return importlib.import_module("fairsched_before.adapter.scheduler").FairScheduler


def timed(builders: dict[str, Builder], instances: int, steps: int,
          rotate: bool = True) -> dict[str, list[float]]:
    """Each arm's engines' median step times (µs), the engines stepped in turn."""
    engines = [(name, build()) for _ in range(instances) for name, build in builders.items()]
    samples: list[list[int]] = [[] for _ in engines]
    order = list(range(len(engines)))
    for step in range(steps):
        shift = step % len(order) if rotate else 0
        for i in order[shift:] + order[:shift]:
            samples[i].append(_timed_step(engines[i][1], False)[0])
    medians: dict[str, list[float]] = {name: [] for name in builders}
    for (name, _built), values in zip(engines, samples):
        medians[name].append(statistics.median(values) / 1e3)
    return medians


def _print_ratios(title: str, medians: dict[str, list[float]], reference: str) -> None:
    base = statistics.median(medians[reference])
    print(title)
    for name, values in medians.items():
        print(f"  {name:>16}: {statistics.median(values) / base:.3f} "
              f"({min(values) / base:.3f}-{max(values) / base:.3f})")


def _print_rekey(engine: OfflineEngine) -> None:
    """Time re-keys of ``engine``'s waiting queue once its steps have reached a steady
    state (see the module docstring)."""
    for _ in range(50):
        _timed_step(engine, False)
    scheduler = engine.scheduler
    queue = scheduler.waiting
    times = []
    for alpha in (100.0, 10_000.0) * 11:
        scheduler.fairsched_policy.set_alpha(alpha)
        start = time.perf_counter_ns()
        queue.rekey()
        times.append(time.perf_counter_ns() - start)
    median = statistics.median(times)
    print(f"  re-key of {len(queue)} waiting: {median / 1e6:.2f} ms "
          f"({min(times) / 1e6:.2f}-{max(times) / 1e6:.2f}), "
          f"{median / 1e3 / len(queue):.2f} us per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("position", "aa", "knockouts", "rekey", "arms"))
    parser.add_argument("--waiting", default="1000", help="comma-separated queue sizes")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--arms", default="stock,fcfs,default")
    parser.add_argument("--before", type=Path,
                        help="with arms: a directory holding an exported fairsched_plugin "
                             "package, whose plugin arms run too")
    args = parser.parse_args()
    model_dir = write_config_only_model(Path(tempfile.mkdtemp()) / "model")
    before = load_before(args.before) if args.before else None

    def arm(spec: str | type, waiting: int,
            patch: Callable[[Any], None] | None = None, cls_override: type | None = None
            ) -> Builder:
        """An arm of ``schedule_overhead.ARMS`` by name (its plugin class replaced by
        ``cls_override`` when given), or a scheduler class run as stock."""
        cls, config = ARMS[spec] if isinstance(spec, str) else (spec, {})
        cls = cls_override or cls

        def build() -> OfflineEngine:
            engine = _engine(cls, model_dir, config, waiting, "uniform")
            if patch is not None:
                patch(engine.scheduler)
            return engine

        return build

    for waiting in (int(w) for w in args.waiting.split(",")):
        if args.check == "rekey":
            print(f"uniform, {waiting} waiting")
            _print_rekey(arm("default", waiting)())
            continue
        print(f"uniform, {waiting} waiting, medians of {args.steps} steps; ratio to the "
              "first arm's median engine (range over engines)")
        if args.check == "position":
            stock = {f"stock #{i + 1}": arm("stock", waiting) for i in range(4)}
            for rotate in (False, True):
                _print_ratios("rotating order" if rotate else "fixed order, #1 first",
                              timed(stock, 1, args.steps, rotate), "stock #1")
        elif args.check == "aa":
            builders = {"stock": arm("stock", waiting), "fcfs": arm("fcfs", waiting)}
            builders["empty subclass"] = arm(EmptySubclass, waiting)
            builders["wrapping subclass"] = arm(WrappingSubclass, waiting)
            _print_ratios("A/A", timed(builders, args.instances, args.steps), "stock")
        elif args.check == "knockouts":
            builders = {"stock": arm("stock", waiting), "fcfs": arm("fcfs", waiting),
                        "default": arm("default", waiting)}
            for piece in ("monitor", "plan", "check"):
                builders[f"default - {piece}"] = arm("default", waiting, _knock_out(piece))
            _print_ratios("the default's pieces", timed(builders, args.instances, args.steps),
                          "stock")
        else:
            builders = {name: arm(name, waiting) for name in args.arms.split(",")}
            if before is not None:
                for name in args.arms.split(","):
                    if ARMS[name][0] is not ARMS["stock"][0]:
                        builders[f"{name} (before)"] = arm(name, waiting, cls_override=before)
            _print_ratios("arms", timed(builders, args.instances, args.steps),
                          next(iter(builders)))


if __name__ == "__main__":
    main()
