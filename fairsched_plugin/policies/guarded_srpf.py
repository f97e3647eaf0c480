"""Guarded shortest remaining prefill first: the default policy.

Shortest remaining prefill first (SRPF) minimises how long the typical request queues for
the token budget, but on its own it lets a long prompt wait behind every shorter one that
keeps arriving: under load its tail is far worse than first-come, first-served. The guard
bounds each request's wait by what FCFS does on the same engine and traffic.

The FCFS wait of a request arriving now, ``W``, is the prefill work queued ahead of it
(waiting prompts plus the unfinished part of running prefills) over the engine's measured
prefill throughput. FCFS's own tail is the largest ``W`` of a busy period, so a request may
wait as long as the larger of its own ``W`` and the largest ``W`` of the last ``window_s``
seconds, times ``slack``, without making the tail worse than FCFS's:

    deadline = arrival + slack * max(W_at_arrival, max W over the last window_s seconds)

Until its deadline a request is ranked by remaining prefill tokens; once it passes, the
request outranks every request that is not overdue, and overdue requests go earliest
deadline first. The deadline is fixed at arrival, so a request that arrives early in a
burst keeps the short deadline of the wait it met (FCFS would have served it early too),
and one that arrives into a long queue gets its own longer FCFS wait.

The backlog does not depend on the order (the same prefill work is queued whatever the
order), so no FCFS simulation is needed. Throughput is measured only on saturated steps,
those that used the whole budget or left requests waiting, where it is the rate at which a
backlog drains. Until :data:`MIN_RATE_STEPS` such steps were seen every deadline is the
arrival itself: a cold engine serves in arrival order rather than on a guess.

Deadlines are fixed, so the order at any instant has two static lanes (overdue by deadline,
the rest by remaining work) and queues keep one heap per lane (``OrderingPolicy.ranker``).
"""

from __future__ import annotations

from collections import deque

from .auto_alpha import PrefillRateEstimator
from .base import OrderingPolicy, RequestView

MIN_RATE_STEPS = 16
"""Saturated steps measured before deadlines follow the backlog."""


class RecentMax:
    """The largest value observed in the last ``window_s`` seconds (a monotonic deque:
    O(1) amortised per observation)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, float]] = deque()

    def observe(self, now: float, value: float) -> None:
        while self._points and self._points[-1][1] <= value:
            self._points.pop()
        self._points.append((now, value))
        while self._points[0][0] < now - self.window_s:
            self._points.popleft()

    @property
    def value(self) -> float:
        return self._points[0][1] if self._points else 0.0


class GuardedSRPF(OrderingPolicy):
    """Shortest remaining prefill first until a request's FCFS-derived deadline passes."""

    name = "guarded-srpf"
    orders_decodes = False
    uses_deadlines = True

    def __init__(self, slack: float, window_s: float,
                 rate: PrefillRateEstimator | None = None) -> None:
        self.slack = slack
        self.rate = rate if rate is not None else PrefillRateEstimator(min_steps=MIN_RATE_STEPS)
        self.recent_wait = RecentMax(window_s)

    def value(self, view: RequestView) -> float:
        return view.remaining_prefill

    def fcfs_wait(self, backlog_tokens: int) -> float | None:
        """Seconds FCFS would make a request arriving now wait; None until measured."""
        rate = self.rate.rate
        return None if rate is None else backlog_tokens / rate

    def deadline(self, arrival_time: float, backlog_tokens: int) -> float:
        wait = self.fcfs_wait(backlog_tokens)
        if wait is None:
            return arrival_time
        return arrival_time + self.slack * max(wait, self.recent_wait.value)

    def observe_backlog(self, now: float, backlog_tokens: int) -> None:
        wait = self.fcfs_wait(backlog_tokens)
        if wait is not None:
            self.recent_wait.observe(now, wait)

    def observe_step(self, prefill_tokens: int, step_time_s: float | None,
                     saturated: bool) -> None:
        if saturated:
            self.rate.observe(prefill_tokens, step_time_s)

    def describe(self) -> str:
        return (f"guarded-srpf(slack={self.slack:g} x the FCFS wait, window "
                f"{self.recent_wait.window_s:g} s, arrival order until the prefill rate is "
                "measured)")
