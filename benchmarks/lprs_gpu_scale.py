"""LPRS and APC at GPU scale, against stock vLLM at its best token budget and with vLLM's
long-prefill threshold: one suite group, in the simulator.

The chunked-prefill paper's chunk-size mechanisms change how much prefill goes into each step; stock
vLLM's own knobs for that are the token budget (``--max-num-batched-tokens``) and
``--long-prefill-token-threshold``. Every arm runs the suite's requests on the group's
engine (vLLM's serve defaults for the device), at loads set against stock's capacity at
the default budget (read from a suite ``results.json`` that holds the group, or measured).
LPRS plans with the model ``fairsched lprs-predictor`` writes for the group's engine (no
profiling run), while the clock advances by the analytic step model itself.

An arm is a suite arm, optionally followed by ``@BUDGET`` (another token budget) and
``#THRESHOLD`` (vLLM's long-prefill threshold); ``{predictor}`` in it stands for the
written model's path. Ratios are to stock at the default budget.

    python benchmarks/lprs_gpu_scale.py --out benchmarks/results/2026-12-05-lprs-h100 \\
        --capacity-from benchmarks/results/2026-12-05-suite-quick/results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from fairsched_plugin.sim.capacity import find_capacity
from fairsched_plugin.predictor.hardware import accelerator, model_config
from fairsched_plugin.sim.scenarios import SCENARIOS
from fairsched_plugin.sim.step_models import AnalyticStepModel
from fairsched_plugin.sim.suite import _r, group_settings, run_cell
from fairsched_plugin.sim.surrogate import build

PREDICTOR = "predictor.path={predictor}"
ARMS = ("stock", "stock@4096", "stock@2048", "stock#2048", "stock#512",
        "guarded-srpf", "guarded-srpf@2048",
        f"fcfs+lprs+apc:{PREDICTOR}", f"guarded-srpf+lprs+apc:{PREDICTOR}")
METRICS = (("median TTFT", "ttft_p50"), ("mean TTFT", "ttft_mean"), ("P99 TTFT", "ttft_p99"),
           ("mean E2E", "e2e_mean"), ("output tok/s", "output_tps"))


def split_arm(spec: str) -> tuple[str, int | None, int]:
    """``ARM[@BUDGET][#THRESHOLD]`` -> (arm, budget or None, threshold)."""
    spec, _, threshold = spec.partition("#")
    arm, _, budget = spec.partition("@")
    return arm, int(budget) if budget else None, int(threshold) if threshold else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="azure-conv")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--mode", default="async", choices=("async", "sync"))
    parser.add_argument("--loads", default="0.5,1,1.1,1.3")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--capacity-from", type=Path,
                        help="a suite results.json holding the group (else measured)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    scenario = SCENARIOS[args.scenario]
    case = scenario.build(args.num_requests)
    model = AnalyticStepModel(model_config(args.model), accelerator(args.device), args.device)
    settings = group_settings(scenario, args.device, model, args.mode)
    key = (args.scenario, args.device, args.model, args.mode)
    capacity = None
    if args.capacity_from is not None:
        groups = json.loads(args.capacity_from.read_text())["groups"]
        capacity = next((g["capacity_rps"] for g in groups
                         if (g["scenario"], g["device"], g["model"], g["mode"]) == key), None)
    if capacity is None:
        capacity = _r(find_capacity(case, model, settings).rate)
    args.out.mkdir(parents=True, exist_ok=True)
    predictor = args.out / "lprs.onnx"
    fit = build(f"analytic:{args.device}:{args.model}", predictor,
                settings.max_num_batched_tokens, settings.max_num_seqs, settings.max_model_len)
    cells = []
    for load in (float(x) for x in args.loads.split(",")):
        rate = _r(load * capacity)
        for spec in args.arms.split(","):
            arm, budget, threshold = split_arm(spec.replace("{predictor}", str(predictor)))
            engine = dataclasses.replace(
                settings, long_prefill_token_threshold=threshold,
                max_num_batched_tokens=budget or settings.max_num_batched_tokens)
            metrics = run_cell(case, model, engine, arm, rate)
            cells.append({"load": load, "rate": rate, "arm": spec, "metrics": metrics})
            print(f"load {load:g} {spec}: median TTFT {metrics['ttft_p50'] * 1e3:.0f} ms, "
                  f"P99 {metrics['ttft_p99'] * 1e3:.0f} ms", flush=True)
    results = {"group": key, "engine": dataclasses.asdict(settings), "capacity_rps": capacity,
               "predictor_fit": {k: v for k, v in fit.items() if k != "ranges"},
               "cells": cells}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "table.md").write_text(table(results))
    print(table(results))
    return 0


def table(results: dict) -> str:
    """Every arm's ratios to stock at the default budget, per load; stock's row absolute."""
    lines = ["| load | arm | " + " | ".join(name for name, _ in METRICS)
             + " | P99 TTFT long |", "|---|---|" + "---|" * (len(METRICS) + 1)]
    for cell in results["cells"]:
        base = next(c for c in results["cells"]
                    if c["load"] == cell["load"] and c["arm"] == "stock")["metrics"]
        m = cell["metrics"]
        long_p99 = m["by_class"]["long"]["p99"]
        if cell["arm"] == "stock":
            values = [f"{m[k]:,.0f}" if k == "output_tps" else f"{m[k]:.3f} s"
                      for _, k in METRICS] + [f"{long_p99:.3f} s"]
        else:
            values = [f"{m[k] / base[k]:.2f}" for _, k in METRICS]
            values.append(f"{long_p99 / base['by_class']['long']['p99']:.2f}")
        arm = cell["arm"].replace(f":{PREDICTOR}", "")
        lines.append(f"| {cell['load']:g}x | {arm} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
