"""Simulated vs real: the main job's workload and arms, simulated with a step model,
against the real runs' report (benchmarks/results/2026-11-30-simulator-checks/real-engine/report.json.gz, 3 repeats per arm and load).

Per arm and load: median and P99 TTFT, mean E2E and output throughput, the simulated
value, the real mean and range over repeats, the error against the real mean and the real
runs' own spread ((max - min) / mean); then whether the arms rank the same per metric.

    PYTHONPATH=. python benchmarks/sim_validation.py --sim runs/sim-main/report.json \
        [--real benchmarks/results/2026-11-30-simulator-checks/real-engine/report.json.gz] [--markdown out.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fairsched_plugin.experiment.report import read_report

METRICS = (("TTFT P50 (ms)", ("latency", "ttft_s", "p50"), 1e3),
           ("TTFT P99 (ms)", ("latency", "ttft_s", "p99"), 1e3),
           ("E2E mean (ms)", ("latency", "e2e_s", "mean"), 1e3),
           ("Output tok/s", ("throughput", "output_tokens_per_s"), 1.0))
LOWER_IS_BETTER = {"Output tok/s": False}


def leaf(node: dict[str, Any], path: tuple[str, ...]) -> dict[str, float]:
    for key in path:
        node = node[key]
    return node


def compare(sim: dict[str, Any], real: dict[str, Any]) -> str:
    arms = [a for a in real["arms"] if a in sim["arms"]]
    categories = list(real["arms"][arms[0]]["by_category"])
    lines = ["| load | arm | metric | simulated | real mean [min, max] | error | real spread |",
             "|---|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {name: [] for name, _, _ in METRICS}
    spreads: dict[str, list[float]] = {name: [] for name, _, _ in METRICS}
    ranks = []
    for category in categories:
        for name, path, scale in METRICS:
            sim_values, real_values = {}, {}
            for arm in arms:
                s = leaf(sim["arms"][arm]["by_category"][category], path)["mean"] * scale
                r = leaf(real["arms"][arm]["by_category"][category], path)
                mean, low, high = (r[k] * scale for k in ("mean", "min", "max"))
                err = (s - mean) / mean
                spread = (high - low) / mean
                errors[name].append(abs(err))
                spreads[name].append(spread)
                sim_values[arm], real_values[arm] = s, mean
                lines.append(f"| {category} | {arm} | {name} | {s:.0f} | {mean:.0f} "
                             f"[{low:.0f}, {high:.0f}] | {err:+.0%} | {spread:.0%} |")
            reverse = not LOWER_IS_BETTER.get(name, True)
            sim_order = sorted(arms, key=sim_values.get, reverse=reverse)
            real_order = sorted(arms, key=real_values.get, reverse=reverse)
            ranks.append((category, name, sim_order, real_order))
    out = ["## Per arm and load", "", *lines, "", "## Mean absolute error vs the real runs' "
           "own spread", "", "| metric | mean abs error | mean real spread |", "|---|---|---|"]
    for name in errors:
        out.append(f"| {name} | {sum(errors[name]) / len(errors[name]):.0%} | "
                   f"{sum(spreads[name]) / len(spreads[name]):.0%} |")
    out += ["", "## Ranking (best first)", "", "| load | metric | simulated | real | same |",
            "|---|---|---|---|---|"]
    same = 0
    for category, name, s, r in ranks:
        same += s == r
        out.append(f"| {category} | {name} | {' > '.join(s)} | {' > '.join(r)} | "
                   f"{'yes' if s == r else 'no'} |")
    out.append(f"\nSame order in {same} of {len(ranks)} (load, metric) pairs. Stock and fcfs "
               "schedule identically in the simulator (fcfs is an exact control), so their "
               "order there is a tie broken by name.")
    out += ["", *policy_effect(sim, real, categories)]
    return "\n".join(out)


def policy_effect(sim: dict[str, Any], real: dict[str, Any], categories: list[str],
                  arm: str = "guarded-srpf", control: str = "fcfs") -> list[str]:
    """The policy's effect against its exact control arm: simulated ratio vs the real
    paired ratios (repeat r of the arm over repeat r of the control)."""
    if arm not in sim["arms"] or control not in sim["arms"]:
        return []
    lines = [f"## Policy effect: {arm} / {control}", "",
             "| load | metric | simulated | real paired ratios mean [min, max] | "
             "same direction | real range holds the simulated ratio |",
             "|---|---|---|---|---|---|"]
    agree = total = inside = 0
    for category in categories:
        reps = {a: [e["summary"] for e in real["arms"][a]["repeats"]
                    if e["category"] == category] for a in (arm, control)}
        for name, path, _ in METRICS:
            s = (leaf(sim["arms"][arm]["by_category"][category], path)["mean"]
                 / leaf(sim["arms"][control]["by_category"][category], path)["mean"])
            ratios = [leaf(a, path) / leaf(c, path) for a, c in zip(reps[arm], reps[control])]
            mean = sum(ratios) / len(ratios)
            same = (s - 1) * (mean - 1) > 0
            held = min(ratios) <= s <= max(ratios)
            agree += same
            inside += held
            total += 1
            lines.append(f"| {category} | {name} | {s:.2f} | {mean:.2f} [{min(ratios):.2f}, "
                         f"{max(ratios):.2f}] | {'yes' if same else 'no'} | "
                         f"{'yes' if held else 'no'} |")
    lines.append(f"\nSame direction in {agree} of {total}; the simulated ratio lies within "
                 f"the real repeats' range in {inside} of {total}.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sim", type=Path, required=True)
    parser.add_argument("--real", type=Path, default=Path("benchmarks/results/2026-11-30-simulator-checks/real-engine/report.json.gz"))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    text = compare(read_report(args.sim), read_report(args.real))
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
