"""A verdict table: each arm against stock vLLM, per load, with the targets checked.

Reads the ``report.json`` of a ``fairsched bench`` or ``fairsched simulate`` run that has a
``stock`` arm, classes each case by stock's own median TTFT (light below 100 ms, moderate
100-500 ms, heavy above 1 s, "between" otherwise) and prints, per case and client, every
arm's repeat-paired ratios to stock (median over repeats, range in brackets) and which of
the targets the typical repeat meets:

* heavy: median TTFT <= 0.5x, P99 TTFT <= 1.1x, mean E2E <= 1.0x, output tok/s >= 0.95x;
* moderate: the same with median TTFT <= 0.8x;
* light: never worse than stock (here: P99 and mean E2E <= 1.1x, throughput >= 0.95x).

With ``--plot PNG`` it also draws the frontier the issue asks for: per case, every arm's
median TTFT against its P99 TTFT as ratios to stock (typical repeat, bars for the range),
with the target box.

    .venv/bin/python benchmarks/frontier_table.py runs/frontier-cpu/report.json \
        --plot runs/frontier-cpu/frontier.png
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from fairsched_plugin.experiment.report import PAIRED_COLUMNS, paired_ratios, read_report

BASELINE = "stock"
TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    "heavy": {"Median TTFT": ("<=", 0.5), "P99 TTFT": ("<=", 1.1), "Mean E2E": ("<=", 1.0),
              "Output tok/s": (">=", 0.95)},
    "moderate": {"Median TTFT": ("<=", 0.8), "P99 TTFT": ("<=", 1.1), "Mean E2E": ("<=", 1.0),
                 "Output tok/s": (">=", 0.95)},
    "light": {"P99 TTFT": ("<=", 1.1), "Mean E2E": ("<=", 1.1), "Output tok/s": (">=", 0.95)},
}
SHOWN = ("Median TTFT", "P99 TTFT", "Mean TTFT", "Mean E2E", "Output tok/s", "Mean TPOT",
         "P99 TPOT")


def load_class(stock_median_ttft_s: float) -> str:
    if stock_median_ttft_s < 0.1:
        return "light"
    if stock_median_ttft_s <= 0.5:
        return "moderate"
    if stock_median_ttft_s > 1.0:
        return "heavy"
    return "between"


def stock_medians(arms: dict[str, Any]) -> dict[str, float]:
    """Per case: stock's median TTFT, the mean over its repeats."""
    per_case: dict[str, list[float]] = {}
    for repeat in arms[BASELINE]["repeats"]:
        ttft = repeat["summary"]["latency"]["ttft_s"]
        per_case.setdefault(repeat["category"], []).append(ttft["p50"])
    return {case: float(np.mean(values)) for case, values in per_case.items()}


def _typical(values: list[float | None]) -> tuple[float | None, str]:
    known = sorted(v for v in values if v is not None)
    if not known:
        return None, "n/a"
    median = float(np.median(known))
    if len(known) == 1:
        return median, f"{median:.2f}x"
    return median, f"{median:.2f}x [{known[0]:.2f}-{known[-1]:.2f}]"


def verdict(load: str, typical: dict[str, float | None]) -> str:
    """The targets the typical repeat misses, or "all met"."""
    targets = TARGETS.get(load)
    if targets is None:
        return "(no target)"
    missed = []
    for label, (op, bound) in targets.items():
        value = typical[label]
        ok = value is not None and (value <= bound if op == "<=" else value >= bound)
        if not ok:
            missed.append(f"{label} {op} {bound:g}")
    return "all met" if not missed else "misses " + ", ".join(missed)


def render(report: dict[str, Any]) -> str:
    arms = report["arms"]
    medians = stock_medians(arms)
    labels = [label for label, _path, _key in PAIRED_COLUMNS]
    lines = []
    for client in ("replay", "vllm_bench"):
        for case, by_arm in paired_ratios(arms, BASELINE, client).items():
            load = load_class(medians[case])
            lines.append(f"\n{case} ({client}), {load}: stock's median TTFT "
                         f"{medians[case] * 1000:.0f} ms\n")
            lines.append("| arm | " + " | ".join(SHOWN) + " | targets |")
            lines.append("|---" * (len(SHOWN) + 2) + "|")
            for arm, repeats in by_arm.items():
                if arm == BASELINE:
                    continue
                cells, typical = [], {}
                for label in SHOWN:
                    i = labels.index(label)
                    typical[label], text = _typical([r[i] for r in repeats])
                    cells.append(text)
                lines.append(f"| {arm} | " + " | ".join(cells) + f" | {verdict(load, typical)} |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path, client: str = "replay") -> None:
    """Median against P99 TTFT ratio per arm, one panel per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = report["arms"]
    medians = stock_medians(arms)
    labels = [label for label, _path, _key in PAIRED_COLUMNS]
    im, ip = labels.index("Median TTFT"), labels.index("P99 TTFT")
    cases = paired_ratios(arms, BASELINE, client)
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 5.5), squeeze=False)
    for ax, (case, by_arm) in zip(axes[0], cases.items()):
        load = load_class(medians[case])
        bound = TARGETS.get(load, {})
        if "P99 TTFT" in bound:
            ax.add_patch(plt.Rectangle((0, 0), bound.get("Median TTFT", ("<=", 1.1))[1],
                                       bound["P99 TTFT"][1], color="tab:green", alpha=0.12,
                                       label="targets"))
        for arm, repeats in by_arm.items():
            xs = sorted(r[im] for r in repeats if r[im] is not None)
            ys = sorted(r[ip] for r in repeats if r[ip] is not None)
            if not xs or not ys:
                continue
            x, y = float(np.median(xs)), float(np.median(ys))
            ax.errorbar(x, y, xerr=[[x - xs[0]], [xs[-1] - x]], yerr=[[y - ys[0]], [ys[-1] - y]],
                        fmt="o", capsize=3)
            ax.annotate(arm, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axvline(1, color="grey", lw=0.5)
        ax.axhline(1, color="grey", lw=0.5)
        ax.set_title(f"{case}: {load} (stock median {medians[case] * 1000:.0f} ms)")
        ax.set_xlabel("median TTFT / stock")
        ax.set_ylabel("P99 TTFT / stock")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path,
                        help="report.json (or .json.gz) of a run with a stock arm")
    parser.add_argument("--plot", type=Path, help="write the frontier plot here (PNG)")
    args = parser.parse_args()
    report = read_report(args.report)
    print(render(report))
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
