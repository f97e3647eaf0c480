"""Guarded shortest remaining prefill first: the default policy.

Shortest remaining prefill first (SRPF) minimises how long the typical request queues for
the token budget, but on its own it lets a long prompt wait behind every shorter one that
keeps arriving: under load its tail is far worse than first-come, first-served. The guard
bounds that tail by what FCFS would do now. The prefill work queued at this moment
(waiting prompts plus the unfinished part of running prefills) over the engine's measured
prefill throughput is how long FCFS would make a request arriving now wait, ``W``: the
current FCFS wait. A request that has already waited ``slack * W`` is overdue: overdue
requests outrank all others and go in arrival order; the rest go shortest remaining
prefill first. Under FCFS nobody waits much longer than the largest ``W`` of the run, so
with ``slack`` near 1 the guarded order keeps the longest waits near FCFS's, while every
request that is not overdue, almost every short one, is served shortest first.

Both lanes are static orders (arrival time, remaining prefill), and which requests are
overdue is a prefix of the arrival order: the waiting queue keeps one heap per lane and
moves nothing between them as time passes.

The backlog does not depend on the order (the same prefill work is queued whatever the
order), so no FCFS simulation is needed. Throughput is measured only on saturated steps,
those that used the whole budget or left requests waiting, where it is the rate at which a
backlog drains. Until :data:`MIN_RATE_STEPS` such steps were seen every waiting request is
overdue: a cold engine serves in arrival order rather than on a guess.
"""

from __future__ import annotations

from .auto_alpha import PrefillRateEstimator
from .base import OrderingPolicy, RequestView

MIN_RATE_STEPS = 16
"""Saturated steps measured before the guard follows the backlog."""


class GuardedSRPF(OrderingPolicy):
    """Shortest remaining prefill first, except for requests older than the FCFS wait."""

    name = "guarded-srpf"
    orders_decodes = False
    guards_tail = True

    def __init__(self, slack: float, rate: PrefillRateEstimator | None = None) -> None:
        self.slack = slack
        self.rate = rate if rate is not None else PrefillRateEstimator(min_steps=MIN_RATE_STEPS)

    def value(self, view: RequestView) -> float:
        return view.remaining_prefill

    def current_fcfs_wait(self, backlog_tokens: int) -> float | None:
        """Seconds FCFS would make a request arriving now wait; None until measured."""
        rate = self.rate.rate
        return None if rate is None else backlog_tokens / rate

    def overdue_cutoff(self, now: float, backlog_tokens: int) -> float:
        wait = self.current_fcfs_wait(backlog_tokens)
        return now if wait is None else now - self.slack * wait

    def observe_step(self, prefill_tokens: int, step_time_s: float | None,
                     saturated: bool) -> None:
        if saturated:
            self.rate.observe(prefill_tokens, step_time_s)

    def describe(self) -> str:
        return (f"guarded-srpf(overdue after slack={self.slack:g} x the current FCFS wait, "
                "arrival order until the prefill rate is measured)")
