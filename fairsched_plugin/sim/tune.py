"""``fairsched tune``: search policies and settings on the simulator for a workload and a
step-time model, against stock vLLM.

The objective (the defaults): the lowest median TTFT among candidates whose P99
TTFT is at most 1.1x stock's, mean E2E at most 1.0x and output throughput at least 0.95x;
optionally (``--max-tpot-ratio``) the P99 request's time per output token at most that
ratio of stock's, because holding decodes back (``decode_share``) buys TTFT with TPOT.
Every candidate is an arm spec (``experiment.arms``), so the winner runs unchanged in
``fairsched bench`` and its config prints as the ``--additional-config`` JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..experiment.arms import STOCK, Arm, parse_arm, parse_arms
from ..experiment.cases import plugin_settings
from ..experiment.metrics import summarize_run
from ..cli_types import positive_float, positive_int
from ..config import ConfigError
from ..predictor.runtime import PredictorError
from ..extras import available, note_no_plots
from ..user_files import output_dir
from .cli import add_engine_arguments, case_loader, settings_from_args
from .engine_settings import SimulationStalled, describe
from ..predictor.hardware import PresetError
from .step_models import parse_step_model

DEFAULT_SPACE = (
    "fcfs",
    "aging:alpha=auto:auto_factor={0.1,0.25,0.5,1,2}",
    "aging:alpha={10,37.5,150,600}",
    "aging-spf", "spf",
    "guarded-srpf:slack={1,1.25,1.5}",
    "guarded-aging:slack={1,1.25,1.5,2}:auto_factor={0.1,0.25}",
    "guarded-srpf:slack={1,1.25}:decode_share={0.25,0.33,0.4}",
    "guarded-srpf:slack=1.25:decode_share=0.3:decode_share_max_tpot_ms={100,150,250}",
    "preflow:age_doubling_s={0.1,1}", "hrrn",
    "fcfs+apc:apc.max_active_prefills={2,4,8}:apc.min_chunk={16,64}",
)
"""Candidates; ``{a,b}`` expands to one candidate per value (every combination)."""


@dataclass
class Candidate:
    arm: str
    ttft_p50: float
    ttft_p99: float
    e2e_mean: float
    throughput: float
    tpot_p99: float = 0.0
    """The P99 over requests of each request's time per output token (s)."""
    feasible: bool = False
    ratios: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    """Median and P99 TTFT, mean E2E, throughput and P99 TPOT, over stock's."""


def expand(spec: str) -> list[str]:
    """``aging:alpha={1,2}`` -> ``aging:alpha=1``, ``aging:alpha=2``."""
    parts: list[list[str]] = []
    rest = spec
    while "{" in rest:
        head, _, tail = rest.partition("{")
        values, _, rest = tail.partition("}")
        parts.append([head])
        parts.append([v.strip() for v in values.split(",") if v.strip()])
    parts.append([rest])
    return ["".join(choice) for choice in itertools.product(*parts)]


def metrics_of(runs: Sequence[dict[str, Any]]) -> tuple[float, float, float, float, float]:
    """Median and P99 TTFT, mean E2E (s), output tokens/s and the P99 request's TPOT (s),
    averaged over the runs (cases and seeds); TPOT is 0 when no request had two output
    tokens to measure it by."""
    summaries = [summarize_run(run["requests"]) for run in runs]
    lat = [s["latency"] for s in summaries]
    tpots = [x["tpot_s"]["p99"] for x in lat if x["tpot_s"]["p99"] is not None]
    return (float(np.mean([x["ttft_s"]["p50"] for x in lat])),
            float(np.mean([x["ttft_s"]["p99"] for x in lat])),
            float(np.mean([x["e2e_s"]["mean"] for x in lat])),
            float(np.mean([s["throughput"]["output_tokens_per_s"] for s in summaries])),
            float(np.mean(tpots)) if tpots else 0.0)


def judge(candidates: list[Candidate], base: Candidate, limits: argparse.Namespace) -> None:
    for c in candidates:
        c.ratios = (c.ttft_p50 / base.ttft_p50, c.ttft_p99 / base.ttft_p99,
                    c.e2e_mean / base.e2e_mean, c.throughput / base.throughput,
                    c.tpot_p99 / base.tpot_p99 if base.tpot_p99 > 0 else 1.0)
        c.feasible = (c.ratios[1] <= limits.max_p99_ratio + 1e-12
                      and c.ratios[2] <= limits.max_e2e_ratio + 1e-12
                      and c.ratios[3] >= limits.min_throughput_ratio - 1e-12
                      and (limits.max_tpot_ratio is None or base.tpot_p99 <= 0
                           or c.ratios[4] <= limits.max_tpot_ratio + 1e-12))


def frontier(candidates: list[Candidate]) -> list[Candidate]:
    """Candidates no other beats on both median and P99 TTFT."""
    return [c for c in candidates
            if not any(o.ttft_p50 <= c.ttft_p50 and o.ttft_p99 <= c.ttft_p99
                       and (o.ttft_p50, o.ttft_p99) != (c.ttft_p50, c.ttft_p99)
                       for o in candidates)]


def best(candidates: list[Candidate], base: Candidate) -> Candidate | None:
    """The feasible candidate with the lowest median TTFT, if it beats stock's (stock is
    always a candidate: a policy no better than vLLM's own is not worth deploying)."""
    feasible = [c for c in candidates if c.feasible and c.ttft_p50 < base.ttft_p50]
    return min(feasible, key=lambda c: (c.ttft_p50, c.ttft_p99)) if feasible else None


def tune(arms: list[Arm], args: argparse.Namespace,
         progress: Callable[[str], None] | None = None) -> tuple[Candidate, list[Candidate]]:
    """Stock and every candidate on the same cases; candidates judged against stock."""
    model = parse_step_model(args.step_model)
    cases_for = case_loader(args)
    cache = {r: cases_for(r) for r in range(args.repeat)}
    settings, sources = settings_from_args(args, model)
    print(describe(settings, sources))
    # vLLM and torch load here, once the arguments and inputs are known to be good.
    from .matrix import run_matrix

    runs, _ = run_matrix([parse_arm(STOCK), *arms], cache.__getitem__, model, settings,
                         repeat=args.repeat, trace=False, progress=progress)
    base = Candidate(STOCK, *metrics_of(runs[STOCK]))
    candidates = [Candidate(arm.name, *metrics_of(runs[arm.name])) for arm in arms]
    judge([base, *candidates], base, args)
    return base, candidates


def _plot(path: Path, base: Candidate, candidates: list[Candidate],
          winner: Candidate | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    front = {c.arm for c in frontier(candidates)}
    for c in candidates:
        ax.scatter(c.ttft_p50 * 1e3, c.ttft_p99 * 1e3, s=18,
                   color="tab:blue" if c.feasible else "lightgray",
                   edgecolors="black" if c.arm in front else "none")
    ax.scatter(base.ttft_p50 * 1e3, base.ttft_p99 * 1e3, marker="s", color="black",
               label="stock")
    if winner is not None:
        ax.scatter(winner.ttft_p50 * 1e3, winner.ttft_p99 * 1e3, marker="*", s=160,
                   color="tab:red", label=f"best: {winner.arm}")
    ax.set_xlabel("median TTFT (ms)")
    ax.set_ylabel("P99 TTFT (ms)")
    ax.set_title("tune: candidates (blue feasible, outlined on the TTFT frontier)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune", help="search policies and settings on the simulator for a workload and a "
                     "step-time model; print the frontier and the best config",
        description="Simulates stock vLLM and every candidate arm on the same workload "
                    "and picks the lowest median TTFT among the candidates within the "
                    "limits below, relative to stock: P99 TTFT, mean end-to-end latency, "
                    "output throughput and, optionally, the P99 time per output token. "
                    "Prints the frontier and the winner's --additional-config JSON; a "
                    "candidate is an arm spec, so the winner runs unchanged in bench.")
    parser.add_argument("--space", action="append", metavar="ARM",
                        help="candidate arm spec, {a,b} expands (repeatable; default: "
                             + "; ".join(DEFAULT_SPACE) + ")")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="workload seeds per candidate")
    parser.add_argument("--max-p99-ratio", type=positive_float, default=1.1,
                        help="a candidate's P99 TTFT may be at most this ratio of stock's")
    parser.add_argument("--max-e2e-ratio", type=positive_float, default=1.0,
                        help="a candidate's mean end-to-end latency may be at most this "
                             "ratio of stock's")
    parser.add_argument("--min-throughput-ratio", type=float, default=0.95,
                        help="a candidate's output throughput must be at least this ratio "
                             "of stock's")
    parser.add_argument("--max-tpot-ratio", type=positive_float, default=None,
                        help="also cap the P99 request's time per output token at this "
                             "ratio of stock's (default: no cap; held decodes trade TPOT "
                             "for TTFT)")
    parser.add_argument("--out", type=Path, default=Path("runs/tune"),
                        help="directory for the candidates' results and the frontier")
    add_engine_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    specs = [s for spec in (args.space or DEFAULT_SPACE) for s in expand(spec)]
    try:
        arms = parse_arms(",".join(dict.fromkeys(specs)), plugin_settings(args.set))
        output_dir(args.out)  # before the simulations, not after them
        base, candidates = tune(arms, args)
    except (ConfigError, PresetError, PredictorError, SimulationStalled, ValueError,
            OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    winner = best(candidates, base)
    lines = ["| candidate | TTFT P50 (ms) | TTFT P99 (ms) | E2E mean (ms) | tok/s | "
             "P99 TPOT (ms) | P50 / P99 / E2E / tok/s / TPOT vs stock | feasible | frontier |",
             "|---|---|---|---|---|---|---|---|---|"]
    front = {c.arm for c in frontier(candidates)}
    for c in [base, *sorted(candidates, key=lambda c: (not c.feasible, c.ttft_p50))]:
        r = c.ratios
        lines.append(f"| {c.arm} | {c.ttft_p50 * 1e3:.0f} | {c.ttft_p99 * 1e3:.0f} | "
                     f"{c.e2e_mean * 1e3:.0f} | {c.throughput:.0f} | {c.tpot_p99 * 1e3:.0f} | "
                     f"{r[0]:.2f} / {r[1]:.2f} / {r[2]:.2f} / {r[3]:.2f} / {r[4]:.2f} | "
                     f"{'yes' if c.feasible else 'no'} | "
                     f"{'yes' if c.arm in front else ''} |")
    table = "\n".join(lines)
    print(table)
    if available("matplotlib"):
        _plot(args.out / "tune.png", base, candidates, winner)
    else:
        note_no_plots(f"table {args.out / 'tune.md'}")
    (args.out / "tune.md").write_text(table + "\n")
    if winner is None:
        print("no candidate meets the objective with a lower median TTFT than stock; "
              "stock vLLM stays best")
        return 1
    from .scheduler_factory import arm_additional_config

    arm = next(a for a in arms if a.name == winner.arm)
    config = arm_additional_config(arm, None)
    (args.out / "best.json").write_text(json.dumps(config) + "\n")
    print(f"best: {winner.arm} (median TTFT {winner.ratios[0]:.2f}x stock, "
          f"P99 TPOT {winner.ratios[4]:.2f}x)")
    print(f"--additional-config '{json.dumps(config)}'")
    return 0
