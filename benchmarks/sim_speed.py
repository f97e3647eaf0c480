"""Simulator speed: simulated requests per second of wall time, and where the time goes.

Runs stock vLLM and one plugin arm on the same ShareGPT case (no trace). Shares are of
CPU time (process_time; on a shared machine wall time also counts other processes):
vLLM's scheduler is stock's schedule() + update_from_output(); the plugin's is the plugin
arm's extra CPU in those calls over stock's (its wrapper, plan and queues); the step
model's is its own calls.

    PYTHONPATH=. python benchmarks/sim_speed.py --num-requests 10000 --arm aging

Past the pool's size (53,279 pairs here) the case is built in parts of at most the pool,
each with its own seed, one after another in time; a part repeats prompts of another,
which a simulation without prefix caching does not notice. Peak memory (max RSS) is
printed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import time
from pathlib import Path

from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.experiment.pairs import read_pool
from fairsched_plugin.experiment.workloads import build_workload
from fairsched_plugin.predictor import analytic
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.engine import simulate
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.sim.step_models import AnalyticStepModel, parse_step_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--arm", default="aging")
    parser.add_argument("--step-model", default="analytic:h100:qwen3-8b")
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--pool", type=Path, default=Path(".cache/sharegpt-pool.jsonl"))
    args = parser.parse_args()
    case = build_case(read_pool(args.pool), args.num_requests, args.rate)
    model = parse_step_model(args.step_model)
    settings = SimSettings(max_num_batched_tokens=args.budget)
    if isinstance(model, AnalyticStepModel):
        settings = SimSettings(max_num_batched_tokens=args.budget,
                               kv_cache_tokens=analytic.kv_cache_tokens(model.config,
                                                                        model.accelerator),
                               kv_bytes_per_token=model.config.kv_bytes_per_token)
    results = {}
    for spec in ("stock", args.arm):  # warm-up: imports and vLLM's first config are slow
        simulate(RunSpec(parse_arm(spec), case[:20], model, settings))
    for spec in ("stock", args.arm):
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(RunSpec(parse_arm(spec), case, model, settings))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        results[spec] = (result, wall, cpu)
        t = result.timing
        print(f"{spec}: {len(case)} requests, {t.steps} steps, wall {wall:.1f} s "
              f"(CPU {cpu:.1f} s): {len(case) / wall:.0f} requests/s, "
              f"{t.steps / wall:.0f} steps/s")
    stock, plugin = results["stock"][0].timing, results[args.arm][0].timing
    cpu = results[args.arm][2]
    vllm = stock.schedule_s + stock.update_s
    extra = plugin.schedule_s + plugin.update_s - vllm
    print(f"{args.arm} CPU time shares: vLLM scheduler {vllm / cpu:.0%}, plugin "
          f"{extra / cpu:+.0%} (its schedule/update CPU over stock's; within noise when "
          f"small), step model {plugin.step_model_s / cpu:.0%}, loop and requests "
          f"{plugin.other_s / cpu:.0%}")
    print(f"peak memory (max RSS): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def build_case(pool, num_requests: int, rate: float) -> list:
    """``uniform`` at ``rate``: one part per ``len(pool.pairs)`` requests, seeds 0, 1, ...,
    each part starting one mean gap after the previous one ends."""
    case: list = []
    seed = 0
    while len(case) < num_requests:
        n = min(num_requests - len(case), len(pool.pairs))
        offset = case[-1].arrival_s + 1.0 / rate if case else 0.0
        part = build_workload("uniform", pool, seed=seed, num_requests=n,
                              overrides={"rate_per_s": rate})
        case += [dataclasses.replace(r, arrival_s=r.arrival_s + offset) for r in part]
        seed += 1
    return case


if __name__ == "__main__":
    main()
