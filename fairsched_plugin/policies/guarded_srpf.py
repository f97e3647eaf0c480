"""Guarded shortest remaining prefill first: the default policy.

Shortest remaining prefill first (SRPF) minimises how long the typical request queues for
the token budget, but on its own it lets a long prompt wait behind every shorter one that
keeps arriving: under load its tail is far worse than first-come, first-served. The guard
bounds that tail by FCFS itself. When a request arrives, the prefill work already queued
ahead of it (waiting prompts plus the unfinished part of running prefills) over the
engine's measured prefill throughput is how long FCFS would make it wait, ``W``; its own
prompt takes ``S`` more, so FCFS would give it its first token after about ``W + S``. Its
deadline is the latest start that still meets ``slack`` times that:
``arrival + slack * (W + S) - S`` (never before its arrival). Until then it is ranked by
remaining prefill tokens; once its deadline passes it outranks every request that is not
overdue, and overdue requests go earliest deadline first. So a request's time to first
token stays near at most ``slack`` times what FCFS would have given it (``slack`` of 1
is FCFS for a request that arrives at an idle engine), while every request that fits in
the slack is served shortest first.

The backlog is order-independent (the same prefill work is queued whatever the order), so
the estimate needs no simulation of FCFS. Throughput is measured only on saturated steps,
those with prefill work left queued, where it is the rate at which a backlog drains.
Until :data:`MIN_RATE_STEPS` such steps were seen every deadline is the arrival time
itself: a cold engine serves in arrival order rather than on a guess.

A deadline is fixed at arrival, so the order at any instant has two static lanes (overdue
by deadline, the rest by remaining work) and queues keep one heap per lane (see
``OrderingPolicy.ranker``).
"""

from __future__ import annotations

from .auto_alpha import PrefillRateEstimator
from .base import OrderingPolicy, RequestView

MIN_RATE_STEPS = 16
"""Saturated steps measured before deadlines follow the backlog."""


class GuardedSRPF(OrderingPolicy):
    """Shortest remaining prefill first until a request's FCFS-derived deadline passes."""

    name = "guarded-srpf"
    orders_decodes = False
    uses_deadlines = True

    def __init__(self, slack: float, rate: PrefillRateEstimator | None = None) -> None:
        self.slack = slack
        self.rate = rate if rate is not None else PrefillRateEstimator(min_steps=MIN_RATE_STEPS)

    def value(self, view: RequestView) -> float:
        return view.remaining_prefill

    def deadline(self, arrival_time: float, backlog_tokens: int, own_tokens: int) -> float:
        rate = self.rate.rate
        if rate is None:
            return arrival_time
        latest_start = self.slack * (backlog_tokens + own_tokens) - own_tokens
        return arrival_time + max(latest_start, 0.0) / rate

    def observe_step(self, prefill_tokens: int, step_time_s: float | None,
                     saturated: bool) -> None:
        if saturated:
            self.rate.observe(prefill_tokens, step_time_s)

    def describe(self) -> str:
        return (f"guarded-srpf(slack={self.slack:g} x estimated FCFS wait, "
                "arrival order until the prefill rate is measured)")
