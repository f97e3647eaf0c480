"""The chunked-prefill paper's head-of-line case on a freshly started scheduler: a long prompt
arrives first at an empty queue, short ones right behind it. How many steps do the short ones wait?

Stock vLLM keeps a running prefill ahead of everything that waits, so the short prompts
queue until the long one has been chunked through; an order that lets them pass serves them
in the first steps. Measured in vLLM's own scheduler with fake model outputs (as vLLM's
scheduler tests do), from the very first step: a policy that needs to measure the engine
before it reorders shows it here.

    python -m fairsched_plugin.sim.head_of_line [--arms stock,guarded-srpf,...]

It ships with the simulator because it runs against the vLLM installed beside the plugin:
an operator can check a policy on their own vLLM release before serving with it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from ..experiment.arms import STOCK, parse_arm
from ..config import FairschedConfig
from .fake_engine import OfflineEngine, make_request, make_scheduler, write_config_only_model
from .scheduler_factory import arm_additional_config


@dataclass(frozen=True)
class Case:
    budget: int = 512
    long_tokens: int = 3000
    shorts: int = 29
    short_tokens: int = 32
    short_after_steps: int = 0
    """Steps the long prompt runs alone before the short ones arrive (0: all queue at once)."""


def short_delays(arm: str, case: Case, model_dir: Path, async_scheduling: bool = True
                 ) -> list[int]:
    """For each short prompt, the steps from its arrival to the step that prefills it."""
    plugin = arm != STOCK
    cls: type[Scheduler]
    if plugin:
        from ..adapter.scheduler import FairScheduler, FairSyncScheduler
        cls = FairScheduler if async_scheduling else FairSyncScheduler
    else:
        cls = AsyncScheduler if async_scheduling else Scheduler
    additional = arm_additional_config(parse_arm(arm), None) if plugin else None
    engine = OfflineEngine(make_scheduler(
        cls, model_dir, max_num_seqs=64, max_num_batched_tokens=case.budget,
        async_scheduling=async_scheduling, additional_config=additional))
    engine.add([make_request("long", case.long_tokens, 4, arrival_time=1000.0)])
    for _ in range(case.short_after_steps):
        engine.step()
    arrived_at = len(engine.steps)
    engine.add([make_request(f"short{i}", case.short_tokens, 4, arrival_time=1000.1 + i * 1e-3)
                for i in range(case.shorts)])
    served: dict[str, int] = {}
    while len(served) < case.shorts:
        record = engine.step()
        for request_id in record.output.num_scheduled_tokens:
            served.setdefault(request_id, len(engine.steps) - 1)
        served.pop("long", None)
    return [served[f"short{i}"] - arrived_at for i in range(case.shorts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairsched_plugin.sim.head_of_line",
                                     description=__doc__.split("\n\n")[0])
    default = FairschedConfig().policy
    parser.add_argument("--arms", default=f"{STOCK},fcfs,{default},guarded-aging,aging,hrrn")
    args = parser.parse_args(argv)
    arms = list(dict.fromkeys(args.arms.split(",")))
    cases = {"all queued at once": Case(), "long running 1 step first": Case(short_after_steps=1)}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_config_only_model(Path(tmp))
        print("Mean steps a short prompt waits behind a 3,000-token prompt that arrived first "
              "(budget 512, 29 prompts of 32 tokens, fresh scheduler, async):\n")
        print("| arm | " + " | ".join(cases) + " |")
        print("|---" * (len(cases) + 1) + "|")
        for arm in arms:
            means = [statistics.mean(short_delays(arm, case, model_dir))
                     for case in cases.values()]
            print(f"| {arm} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
