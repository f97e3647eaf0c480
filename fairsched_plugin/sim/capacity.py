"""Stock vLLM's capacity on a scenario: the request rate it sustains when saturated.

A window's requests are queued on simulated stock vLLM all at once, and its completion
rate is measured: ``SERVED`` of the window divided by the time stock takes to complete
them. Saturated, the engine is never idle and never waits for arrivals, so this is the
most it can sustain on the window's mix; the last requests, completed at low concurrency
once nothing waits any more, are a drain rather than sustained service and are left out.
Below this rate stock's backlog stops growing over a window (work-conserving service
catches up between bursts); above it the backlog grows by the difference
(:func:`backlog_check` probes both sides with the window's own arrival gaps).

The answer depends on the window's mix of prompt and output lengths, not on where its
bursts fall: the rule that came before it (the share of the window with a first token at
its last arrival) moved several-fold with a burst near the window's end. A window must be
long enough that stock stays saturated through most of the measurement: one that it
could mostly hold at once is refused with the smallest length that works.

One case breaks the saturated measurement: a window of short prompts and long outputs
(ShareGPT on an H100, 1,024 sequences) queued at once runs so many requests together that
the KV cache overflows and stock preempts and recomputes, completing far fewer requests
per second than it sustains with the requests arriving over time. So the capacity is
checked once at ``COLLAPSE_LOAD`` x the saturated rate with the window's own gaps; where
stock still keeps up there, the capacity is the highest rate at which its backlog does
not grow (``KEEPS_UP``), bisected.

Loads in reports are fractions of this capacity.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..experiment.arms import STOCK, Arm
from ..experiment.case_files import WorkloadRequest
from ..experiment.traces import at_rate
from ..config import ConfigError
from ..user_files import output_file
from .cli import add_engine_arguments, case_loader, settings_from_args
from .engine_settings import SimSettings, SimulationStalled, describe
from .run_spec import RunSpec
from ..predictor.hardware import PresetError
from .step_models import StepModel, parse_step_model

SERVED = 0.95
"""The share of the window whose completion times measure the sustained rate."""
KEEPS_UP = 0.02
"""Stock keeps up with a rate when its backlog grows by at most this share of arrivals."""
COLLAPSE_LOAD = 1.25
"""Saturation collapsed when stock still keeps up at this multiple of its saturated rate."""
SATURATED = 0.5
"""A window saturates stock when its last request is admitted after this share of the
measurement: before then one was always waiting."""


class WindowTooSmall(ValueError):
    """Stock could hold too much of the window at once for it to saturate."""


@dataclass(frozen=True)
class Capacity:
    rate: float
    """The capacity (requests/s): ``saturated_rate`` unless saturation collapsed."""
    saturated_rate: float
    """Requests/s stock completes when saturated on the window."""
    tokens_per_s: float
    """The saturated rate as prompt + output tokens per second."""
    requests: int
    measured_s: float
    """Virtual time stock took to complete ``SERVED`` of the window."""
    last_admission_s: float
    peak_running: int
    """The most requests stock ran at once."""
    collapsed: bool = False
    """Stock kept up at ``COLLAPSE_LOAD`` x its saturated rate with the window's own gaps:
    queued all at once it ran so many requests that it lost throughput (preempting and
    recomputing), so the capacity is the highest rate it keeps up with instead."""


@dataclass(frozen=True)
class BacklogProbe:
    """Stock replaying the window at ``rate`` with its own arrival gaps."""

    rate: float
    load: float
    """``rate`` as a fraction of the capacity."""
    backlog_growth: float
    """Growth of the unserved backlog over the window, as a share of arrivals (least
    squares over time-binned means of the backlog, divided by the arrival rate): about
    0 when stock keeps up, about ``1 - capacity / rate`` when it does not."""
    completion_rate: float
    """Requests/s with a first token by the last arrival, over the window's span."""
    median_ttft_s: float | None


Runner = Callable[[RunSpec, bool], Any]
"""Runs a spec to completion, or to the first step after the last arrival when told
(``engine.simulate``'s ``stop_at_last_arrival``); returns its ``SimRun``."""


def one_engine(spec: RunSpec, stop_at_last_arrival: bool) -> Any:
    """The default :data:`Runner`: one engine."""
    from .engine import simulate

    return simulate(spec, None, stop_at_last_arrival)


def find_capacity(case: Sequence[WorkloadRequest], step_model: StepModel,
                  settings: SimSettings, tolerance: float = 0.02,
                  run: Runner = one_engine) -> Capacity:
    """Stock's saturated completion rate, checked once at ``COLLAPSE_LOAD`` x of it with
    the window's own gaps. Where stock still keeps up there, saturation made it lose
    throughput (all of a short-prompt window running at once, preempting), so the
    capacity is instead the highest rate at which its backlog does not grow, bisected to
    ``tolerance``."""
    saturated = saturated_rate(case, step_model, settings, run)

    def keeps_up(rate: float) -> bool:
        return (backlog_check(case, rate, 1.0, step_model, settings, run=run).backlog_growth
                <= KEEPS_UP)

    low = COLLAPSE_LOAD * saturated.rate
    if not keeps_up(low):
        return saturated
    high = 2 * low
    while keeps_up(high):
        low, high = high, 2 * high
    while high / low > 1 + tolerance:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if keeps_up(mid) else (low, mid)
    return replace(saturated, rate=low, collapsed=True)


def saturated_rate(case: Sequence[WorkloadRequest], step_model: StepModel,
                   settings: SimSettings, run: Runner = one_engine) -> Capacity:
    """Stock's completion rate with the whole window queued at once (module docstring)."""
    queued = [replace(r, arrival_s=0.0) for r in case]
    result = run(RunSpec(Arm(STOCK, {}), queued, step_model, settings), False)
    rows = [r for r in result.run["requests"] if r["error"] is None]
    if len(rows) < 2:
        raise WindowTooSmall(f"the window has {len(rows)} servable request(s); capacity "
                             "needs a window stock cannot hold at once")
    finish = np.sort([r["finish_s"] for r in rows])
    count = max(int(math.ceil(SERVED * len(rows))), 1)
    measured = float(finish[count - 1])
    admitted = np.array([r["first_scheduled_s"] for r in rows])
    peak = _peak_running(admitted, np.array([r["finish_s"] for r in rows]))
    last_admission = float(admitted.max())
    if last_admission < SATURATED * measured:
        mean_tokens = np.mean([r["prompt_tokens"] + r["target_output_tokens"] for r in rows])
        limit = min(settings.max_num_seqs, int(settings.kv_cache_tokens // mean_tokens))
        smallest = int(math.ceil(2 * max(peak, limit) / 50.0)) * 50
        raise WindowTooSmall(
            f"a window of {len(rows)} requests is too small to saturate stock on these "
            f"settings (it ran up to {peak} at once and admitted the last at "
            f"{last_admission:.2f} s of {measured:.2f} s): use at least about {smallest} "
            "requests")
    served_tokens = sum(r["prompt_tokens"] + r["target_output_tokens"]
                        for r in rows if r["finish_s"] <= measured)
    return Capacity(count / measured, count / measured, served_tokens / measured, len(rows),
                    measured, last_admission, peak)


def _peak_running(admitted: np.ndarray, finished: np.ndarray) -> int:
    """The most requests between admission and completion at any moment."""
    events = np.concatenate([np.stack([admitted, np.ones_like(admitted)], axis=1),
                             np.stack([finished, -np.ones_like(finished)], axis=1)])
    order = np.lexsort((events[:, 1], events[:, 0]))  # completions first at a tie
    return int(np.cumsum(events[order, 1]).max())


def backlog_check(case: Sequence[WorkloadRequest], capacity: float, load: float,
                  step_model: StepModel, settings: SimSettings, bins: int = 10,
                  run: Runner = one_engine) -> BacklogProbe:
    """Replay the window at ``load`` x ``capacity`` up to its last arrival and measure
    whether stock's backlog grows (the check of the capacity against its definition)."""
    rate = load * capacity
    scaled = at_rate(case, rate)
    result = run(RunSpec(Arm(STOCK, {}), scaled, step_model, settings), True)
    rows = [r for r in result.run["requests"] if r["error"] is None]
    end = scaled[-1].arrival_s
    arrived = np.sort([r["arrival_s"] for r in rows])
    first = np.sort([r["first_token_s"] if r["first_token_s"] is not None else np.inf
                     for r in rows])
    times = np.linspace(0.0, end, bins * 50)
    backlog = (np.searchsorted(arrived, times, side="right")
               - np.searchsorted(first, times, side="right"))
    means = backlog.reshape(bins, 50).mean(axis=1)
    centres = times.reshape(bins, 50).mean(axis=1)
    slope = float(np.polyfit(centres, means, 1)[0])
    ttfts = [f - a for f, a in ((r["first_token_s"], r["arrival_s"]) for r in rows)
             if f is not None and f <= end]
    return BacklogProbe(rate, load, slope / rate, len(ttfts) / end if end > 0 else 0.0,
                        float(np.median(ttfts)) if ttfts else None)


# -------------------------------------------------------------------------------- CLI


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    cap = subparsers.add_parser(
        "capacity", help="find the request rate stock vLLM sustains on a workload "
                         "(simulated), to set loads against",
        description="Queues the case's requests all at once on simulated stock vLLM and "
                    f"measures its completion rate over the first {SERVED:.0%} of them: "
                    "the most it sustains on that mix of prompts and outputs, whatever the "
                    "arrival pattern. With --check it also replays the case at 0.9x and "
                    "1.1x of that rate with its own arrival gaps and reports whether "
                    "stock's backlog grows. Loads in the suite's reports are fractions of "
                    "this capacity.")
    add_engine_arguments(cap)
    cap.add_argument("--check", action="store_true",
                     help="also replay at 0.9x and 1.1x of the capacity and report "
                          "stock's backlog growth and completion rate")
    cap.add_argument("--out", type=Path,
                     help="also write the result as JSON here (default: print only)")
    cap.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        model = parse_step_model(args.step_model)
        cases = case_loader(args)(0)
        if len(cases) != 1:
            raise ValueError("capacity takes one case: one workload, one --trace-rate")
        (name, case), = cases.items()
        settings, sources = settings_from_args(args, model)
        out = output_file(args.out) if args.out else None
        print(f"step model: {model.description}")
        print(describe(settings, sources))
        print(f"{name}: {len(case)} requests, queued at once on stock vLLM")
        found = find_capacity(case, model, settings)
        checks = [backlog_check(case, found.rate, load, model, settings)
                  for load in ((0.9, 1.1) if args.check else ())]
    except (ConfigError, PresetError, ValueError, OSError, SimulationStalled) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if found.collapsed:
        print(f"capacity: {found.rate:.2f} req/s: the highest rate at which stock's backlog "
              f"does not grow with the window's own gaps. Queued all at once it completes "
              f"only {found.saturated_rate:.2f} req/s (up to {found.peak_running} requests "
              "at once, losing throughput), but it keeps up at "
              f"{COLLAPSE_LOAD:g}x that")
    else:
        print(f"capacity: {found.rate:.2f} req/s ({found.tokens_per_s:,.0f} prompt + output "
              f"tokens/s): stock completes {SERVED:.0%} of the window in "
              f"{found.measured_s:.1f} s when saturated (up to {found.peak_running} requests "
              "at once)")
    for probe in checks:
        median = "-" if probe.median_ttft_s is None else f"{probe.median_ttft_s:.2f} s"
        print(f"  at {probe.load:g}x ({probe.rate:.2f} req/s, the case's own gaps): backlog "
              f"growth {probe.backlog_growth:+.1%} of arrivals, {probe.completion_rate:.2f} "
              f"req/s with a first token by the last arrival, median TTFT {median}")
    if out is not None:
        out.write_text(json.dumps({
            "case": name, "capacity_rps": found.rate, "step_model": model.description,
            "capacity": asdict(found), "checks": [asdict(p) for p in checks],
            "engine": {**asdict(settings), "sources": sources}}, indent=2))
    return 0
