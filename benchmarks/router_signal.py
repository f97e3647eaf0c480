"""Does a router that reads the plugin's queued prefill work beat the same router reading
queue depth alone?

Takes a fleet group of a ``fairsched suite`` results file (its scenario, device, model,
mode, number of engines and rates, whichever router it ran behind), and reruns its loads
with llm-d's default scorers twice: the
queue scorer reading the waiting count (``llm-d``, as llm-d does) and reading the plugin's
``fairsched:waiting_prompt_tokens`` (``llm-d-work``), each with stock vLLM and with the
plugin's default policy on every engine. Prints median, P99 and mean TTFT, P99 TPOT and
the busiest engine's busy time over the mean, per load, and ``llm-d-work``'s ratios to
``llm-d`` with the same policy. Simulated, so deterministic.

    .venv/bin/python benchmarks/router_signal.py \
        benchmarks/results/2026-12-07-fleets/azure-conv/results.json \
        --rates-from 4xround-robin \
        --out benchmarks/results/2026-12-07-fleets/router-signal.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fairsched_plugin.experiment.arms import STOCK
from fairsched_plugin.predictor.hardware import accelerator, model_config
from fairsched_plugin.sim.routers import parse_fleet
from fairsched_plugin.sim.scenarios import SCENARIOS
from fairsched_plugin.sim.step_models import AnalyticStepModel
from fairsched_plugin.sim.suite import DEFAULT_POLICY, group_settings, run_cell

ROUTERS = ("llm-d", "llm-d-work")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a suite's results.json with the fleet")
    parser.add_argument("--rates-from", dest="fleet", default="4xround-robin",
                        help="the fleet group whose engines and rates to rerun")
    parser.add_argument("--scenario", default="azure-conv")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    group = next(g for g in results["groups"]
                 if g.get("fleet") == args.fleet and g["scenario"] == args.scenario)
    engines = parse_fleet(args.fleet).engines
    scenario = SCENARIOS[group["scenario"]]
    model = AnalyticStepModel(model_config(group["model"]), accelerator(group["device"]),
                              group["device"])
    settings = group_settings(scenario, group["device"], model, group["mode"])
    case = scenario.build(group["requests"])
    loads = sorted({c["load"] for c in results["cells"] if c.get("fleet") == args.fleet
                    and c["scenario"] == args.scenario})
    rows: list[dict[str, Any]] = []
    for load in loads:
        rate = next(c["rate"] for c in results["cells"] if c.get("fleet") == args.fleet
                    and c["scenario"] == args.scenario and c["load"] == load)
        for arm in (STOCK, DEFAULT_POLICY):
            for router in ROUTERS:
                metrics = run_cell(case, model, settings, arm, rate, scenario.closed_loop,
                                   f"{engines}x{router}")
                rows.append({"load": load, "rate": rate, "arm": arm, "router": router,
                             "metrics": metrics})
                print(f"load {load:g} ({rate:.2f} req/s) {arm} behind {router}: median TTFT "
                      f"{metrics['ttft_p50'] * 1e3:.0f} ms, P99 {metrics['ttft_p99'] * 1e3:.0f}"
                      f" ms", flush=True)
    print()
    print(table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"group": group, "rows": rows}, indent=1) + "\n")


def table(rows: list[dict[str, Any]]) -> str:
    """Absolute figures per load, arm and router, and llm-d-work over llm-d."""
    lines = ["| load | arm | router | median TTFT | P99 TTFT | mean TTFT | P99 TPOT | "
             "busiest engine / mean | llm-d-work / llm-d: median, P99, mean TTFT |",
             "|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["load"], r["arm"], r["router"]): r["metrics"] for r in rows}
    for r in rows:
        m = r["metrics"]
        versus = ""
        if r["router"] == "llm-d-work":
            base = by_key[r["load"], r["arm"], "llm-d"]
            versus = " / ".join(f"{m[k] / base[k]:.2f}" for k in ("ttft_p50", "ttft_p99",
                                                                  "ttft_mean"))
        lines.append(f"| {r['load']:g}x ({r['rate']:.1f}) | {r['arm']} | {r['router']} | "
                     f"{m['ttft_p50'] * 1e3:.0f} ms | {m['ttft_p99'] * 1e3:.0f} ms | "
                     f"{m['ttft_mean'] * 1e3:.0f} ms | {m['tpot_p99'] * 1e3:.1f} ms | "
                     f"{m['balance']['busy_max_over_mean']:.2f} | {versus} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
