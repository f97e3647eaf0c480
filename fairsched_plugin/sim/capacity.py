"""Stock vLLM's capacity on a scenario: the highest arrival rate it keeps up with.

A case (a trace window or a generated workload) is replayed at rate R by scaling its
arrival times so its mean rate ``(n - 1) / span`` is R; the relative gaps, and so the
bursts, stay. Stock *keeps up* at R when, at the moment the window's last request
arrives, at least ``KEEP_UP`` of the window has its first token: below capacity the
backlog stays a handful of requests, above it grows with every second of the window
(at 1.02x capacity on 1,000 requests it is already about 2 % of them). The simulation
stops at that moment, so an overloaded probe costs no more than a light one.

The search doubles the rate from the case's own until stock falls behind, then bisects
to ``tolerance``. Loads in reports are fractions of this capacity.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..bench.arms import STOCK, Arm
from ..bench.traces import at_rate
from ..bench.vllm_client import mean_rate
from ..bench.workloads import WorkloadRequest
from ..config import ConfigError
from .cli import add_engine_arguments, case_loader, settings_from_args
from .engine import SimulationStalled, simulate
from .hardware import PresetError
from .scheduler_factory import SimSettings
from .step_models import StepModel, parse_step_model

KEEP_UP = 0.98


@dataclass(frozen=True)
class Probe:
    rate: float
    served_share: float
    """Share of the window with a first token when its last request arrives."""
    median_ttft_s: float | None
    """Median TTFT of the requests served by then."""

    @property
    def keeps_up(self) -> bool:
        return self.served_share >= KEEP_UP


@dataclass(frozen=True)
class Capacity:
    rate: float
    """The highest probed rate stock keeps up with (requests/s)."""
    probes: tuple[Probe, ...]


def probe(case: Sequence[WorkloadRequest], rate: float, step_model: StepModel,
          settings: SimSettings) -> Probe:
    """Stock at ``rate`` up to the last arrival."""
    scaled = at_rate(case, rate)
    result = simulate(Arm(STOCK, {}), scaled, step_model, settings, None,
                      stop_at_last_arrival=True)
    rows = [r for r in result.run["requests"] if r["error"] is None]
    last = scaled[-1].arrival_s
    ttfts = [r["first_token_s"] - r["arrival_s"] for r in rows
             if r["first_token_s"] is not None and r["first_token_s"] <= last]
    share = len(ttfts) / max(len(rows), 1)
    return Probe(rate, share, float(np.median(ttfts)) if ttfts else None)


def find_capacity(case: Sequence[WorkloadRequest], step_model: StepModel,
                  settings: SimSettings, *, tolerance: float = 0.01,
                  progress: Callable[[str], None] | None = None) -> Capacity:
    """Double from the case's own rate until stock falls behind, then bisect until the
    bracket is within ``tolerance`` (relative)."""
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        result = probe(case, rate, step_model, settings)
        probes.append(result)
        if progress is not None:
            median = ("-" if result.median_ttft_s is None
                      else f"{result.median_ttft_s * 1e3:.0f} ms")
            progress(f"  {rate:8.2f} req/s: {result.served_share:6.1%} served by the last "
                     f"arrival, median TTFT {median}: "
                     f"{'keeps up' if result.keeps_up else 'falls behind'}")
        return result.keeps_up

    own = rate = mean_rate(case)
    low, high = 0.0, math.inf
    if run(rate):
        low = rate
        while math.isinf(high):
            rate *= 2
            if run(rate):
                low = rate
            else:
                high = rate
    else:
        high = rate
        while low == 0.0:
            rate /= 2
            if rate < own / 1024:
                raise ValueError("stock keeps up with no rate down to 1/1024 of the case's: "
                                 "the case cannot be served on these settings")
            if run(rate):
                low = rate
            else:
                high = rate
    while high / low > 1 + tolerance:
        mid = math.sqrt(low * high)
        if run(mid):
            low = mid
        else:
            high = mid
    return Capacity(low, tuple(sorted(probes, key=lambda p: p.rate)))


# -------------------------------------------------------------------------------- CLI


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    cap = subparsers.add_parser(
        "capacity", help="find the highest arrival rate stock vLLM keeps up with on a "
                         "workload (simulated), to set loads against",
        description="Replays the case at scaled arrival rates (its bursts kept) on "
                    "simulated stock vLLM: the rate doubles from the case's own until stock "
                    "falls behind (its backlog grows through the window), then bisects to "
                    "--tolerance. Loads in the suite's reports are fractions of this "
                    "capacity.")
    add_engine_arguments(cap)
    cap.add_argument("--tolerance", type=float, default=0.01,
                     help="stop when the bracket is this close, relative")
    cap.add_argument("--out", type=Path,
                     help="also write the probes as JSON here (default: print only)")
    cap.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        model = parse_step_model(args.step_model)
        settings = settings_from_args(args, model)
        cases = case_loader(args)(0)
        if len(cases) != 1:
            raise ValueError("capacity takes one case: one workload, one --trace-rate")
        (name, case), = cases.items()
        print(f"step model: {model.description}")
        print(f"{name}: {len(case)} requests; probing stock vLLM")
        found = find_capacity(case, model, settings, tolerance=args.tolerance, progress=print)
    except (ConfigError, PresetError, ValueError, OSError, SimulationStalled) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"capacity: {found.rate:.2f} req/s (stock serves {KEEP_UP:.0%} of the window by "
          "its last arrival at this rate and falls behind above it)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"case": name, "capacity_rps": found.rate,
                                        "step_model": model.description,
                                        "probes": [asdict(p) for p in found.probes]},
                                       indent=2))
    return 0
