"""While requests queue: each arm's decode batch, prefill rate and step cost, from the traces.

A prefill order cannot change the total work, but it changes how many decodes run while
requests wait, and decode tokens come out of the same budget as the prefills that drain
the queue. For one case of a ``fairsched bench`` or
``fairsched simulate`` report this prints, per arm and repeat, over the steps that ran with
requests waiting: decodes and prefill tokens per step, the mean step time, the prefill
tokens per second of step time, and how far the steps ran above a linear step model fitted
to all the arms' whole traces (``fit_trace_step_model``): the part of the step time that
token counts alone do not explain.

A real run's trace covers every case its server replayed; the steps of one case are those
between the replay's start and its last request's finish. Stock vLLM writes no trace, so a
real run's ``stock`` arm has no row.

    .venv/bin/python benchmarks/queued_steps.py runs/main/report.json --case uniform@x8
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairsched_plugin.experiment.report import read_report
from fairsched_plugin.experiment.run_files import slug
from fit_trace_step_model import fit


@dataclass
class QueuedSteps:
    """One run's steps with requests waiting."""

    arm: str
    repeat: int
    steps: int
    decodes: float
    prefill_tokens: float
    step_ms: float
    prefill_per_s: float
    residual_ms: float


def trace_of(report_dir: Path, arm: str, repeat: int, run: dict[str, Any],
             single: bool) -> tuple[Path, tuple[float, float] | None]:
    """The run's trace file, and the window of its steps in it (None: the whole file).

    A real run names its directory; a simulated one is found where ``fairsched simulate``
    keeps it (``runs/ARM/rN[/CASE]``), one trace per case."""
    meta = run["meta"]
    if "dir" not in meta:
        run_dir = report_dir / "runs" / slug(arm) / f"r{repeat}"
        if not single:
            run_dir = run_dir / slug(run["category"])
        return run_dir / "trace.jsonl", None
    run_dir = Path(meta["dir"])
    trace = run_dir / "trace.jsonl"
    if not trace.exists():
        trace = run_dir.parent / "trace.jsonl"
    with open(run_dir / "requests.jsonl") as file:
        last = max(json.loads(line)["finish_s"] or 0.0 for line in file)
    return trace, (meta["start_wall"], meta["start_wall"] + last)


def read_steps(path: Path, window: tuple[float, float] | None) -> list[dict[str, Any]]:
    with open(path) as file:
        steps = [json.loads(line) for line in file]
    if window is not None:
        steps = [s for s in steps if window[0] <= s["t"] <= window[1]]
    return [s for s in steps if s.get("step_time_s") is not None]


def queued_steps(report_path: Path, case: str | None) -> list[QueuedSteps]:
    """Per arm and repeat of ``case`` (None: the report's only case) that has a trace."""
    report = read_report(report_path)
    categories = {run["category"] for arm in report["arms"].values() for run in arm["repeats"]}
    single = len(categories) == 1
    if case is None and not single:
        raise SystemExit(f"{report_path} has several cases; name one with --case: "
                         + ", ".join(sorted(categories)))
    found: list[tuple[str, int, Path, list[dict[str, Any]]]] = []
    for arm, data in report["arms"].items():
        runs = [run for run in data["repeats"] if case is None or run["category"] == case]
        for repeat, run in enumerate(runs, start=1):
            path, window = trace_of(report_path.parent, arm, repeat, run, single)
            if path.exists():
                found.append((arm, repeat, path, read_steps(path, window)))
    if not found:
        raise SystemExit(f"no trace found for case {case!r} in {report_path}")
    coef, _, _ = fit(sorted({str(path) for _, _, path, _ in found}))
    rows = []
    for arm, repeat, _, steps in found:
        queued = [s for s in steps if s["num_waiting"] > 0]
        if not queued:
            continue
        prefill = np.array([s["prefill_tokens"] for s in queued], dtype=float)
        decodes = np.array([s["decode_tokens"] for s in queued], dtype=float)
        measured = np.array([s["step_time_s"] * 1e3 for s in queued])
        modelled = coef[0] + coef[1] * prefill + coef[2] * decodes
        rows.append(QueuedSteps(
            arm=arm, repeat=repeat, steps=len(queued), decodes=float(decodes.mean()),
            prefill_tokens=float(prefill.mean()), step_ms=float(measured.mean()),
            prefill_per_s=float(prefill.sum() / measured.sum() * 1e3),
            residual_ms=float((measured - modelled).mean())))
    return rows


def render(rows: list[QueuedSteps]) -> str:
    lines = ["| arm | repeat | queued steps | decodes/step | prefill tokens/step | step (ms) "
             "| prefill tok/s | above the linear model (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.arm} | {row.repeat} | {row.steps} | {row.decodes:.1f} | "
                     f"{row.prefill_tokens:.0f} | {row.step_ms:.1f} | {row.prefill_per_s:,.0f} | "
                     f"{row.residual_ms:+.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="report.json (or .json.gz) of bench/simulate")
    parser.add_argument("--case", help="the case, e.g. uniform@x8 (needed when the report has several)")
    args = parser.parse_args()
    print(render(queued_steps(args.report, args.case)))


if __name__ == "__main__":
    main()
