"""The FCFS guard, and the two policies it bounds: ``guarded-srpf`` and ``guarded-aging``.

A request may be served out of arrival order only until FCFS would have served it, times
a slack. FCFS serves a request once the prefill work queued ahead of it when it arrived
has been done, so a request's deadline is a point in *served prefill work*, not in time:

    deadline = served at arrival + slack * max(backlog at arrival,
                                               largest backlog of the last window_s seconds)

where ``backlog`` is the prefill work queued ahead (waiting prompts and the unfinished
part of running prefills) and ``served`` counts every prefill token the engine computed.
Once the served work reaches a request's deadline it is overdue: it outranks every
request that is not, and overdue requests go earliest deadline first.

Why work and not time: the same deadline in seconds needs the prefill rate, and that rate
is not the one FCFS would have had. Serving short prompts first grows the decode batch,
whose tokens come out of the same budget, so the rate falls exactly when the queue is
long; deadlines from the rate measured at arrival come too early and, at heavy load,
nearly every request went overdue and the order collapsed into FCFS (in the simulator
255 of 300 requests at the main job's heavy load). Counted in work, the bound needs no
estimate and holds on any engine; the backlog does not depend on the order (the same
work is queued whatever the order).

The deadline is fixed at arrival, so the order at any instant has two static lanes
(overdue by deadline, the rest by the policy's key) and queues keep one heap per lane
(``OrderingPolicy.ranker``), comparing deadlines with :meth:`overdue_cutoff`.
"""

from __future__ import annotations

from collections import deque

from .aging import AgingPolicy
from .base import OrderingPolicy, RequestView


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


class FcfsGuard:
    """Deadlines in served prefill tokens: ``slack`` times the work FCFS would have done
    before serving the request (or the window's largest such work), plus
    ``size_allowance`` times the request's own prefill work."""

    def __init__(self, slack: float, window_s: float, size_allowance: float = 0.0) -> None:
        self.slack = slack
        self.size_allowance = size_allowance
        self.served = 0
        self.recent_backlog = RecentMax(window_s)

    def deadline(self, backlog_tokens: int, own_tokens: int = 0) -> float:
        return (self.served + self.slack * max(backlog_tokens, self.recent_backlog.value)
                + self.size_allowance * own_tokens)

    def observe_backlog(self, now: float, backlog_tokens: int) -> None:
        self.recent_backlog.observe(now, backlog_tokens)

    def observe_served(self, prefill_tokens: int) -> None:
        self.served += prefill_tokens

    def describe(self) -> str:
        window = self.recent_backlog.window_s
        return (f"overdue after slack={self.slack:g} x the FCFS backlog"
                + (f" (largest of the last {window:g} s)" if window else "")
                + (f" + {self.size_allowance:g} x its own prefill" if self.size_allowance
                   else ""))


class _Guarded:
    """What both guarded policies share: deadlines from an :class:`FcfsGuard`."""

    uses_deadlines = True
    guard: FcfsGuard

    def deadline(self, arrival_time: float, backlog_tokens: int, own_tokens: int) -> float:
        return self.guard.deadline(backlog_tokens, own_tokens)

    def overdue_cutoff(self, now: float) -> float:
        return self.guard.served

    def observe_backlog(self, now: float, backlog_tokens: int) -> None:
        self.guard.observe_backlog(now, backlog_tokens)

    def observe_step(self, prefill_tokens: int) -> None:
        self.guard.observe_served(prefill_tokens)


class GuardedSRPF(_Guarded, OrderingPolicy):
    """Shortest remaining prefill first until a request's FCFS-derived deadline passes.

    Shortest remaining prefill first minimises how long the typical request queues for the
    budget, but alone it lets a long prompt wait behind every shorter one that keeps
    arriving; the guard bounds that."""

    name = "guarded-srpf"
    orders_decodes = False
    key_follows_remaining_work = True

    def __init__(self, slack: float, window_s: float, size_allowance: float = 0.0) -> None:
        self.guard = FcfsGuard(slack, window_s, size_allowance)

    def value(self, view: RequestView) -> float:
        return view.remaining_prefill

    def describe(self) -> str:
        return f"guarded-srpf(shortest remaining prefill first; {self.guard.describe()})"


class GuardedAging(_Guarded, AgingPolicy):
    """Seed 000's Aging order with the automatic alpha, inside the FCFS guard.

    The two protect the tail at different loads. With short queues (bursts at moderate
    load) Aging's age term lets a long prompt overtake younger short ones within a few of
    its own prefill times, which the guard alone allows too late; with long queues the age
    term is nearly arrival order, and the guard's slack is what lets short prompts ahead."""

    name = "guarded-aging"

    def __init__(self, slack: float, window_s: float, auto_factor: float,
                 epoch: float = 0.0, size_allowance: float = 0.0) -> None:
        AgingPolicy.__init__(self, alpha=None, epoch=epoch, auto_factor=auto_factor)
        self.guard = FcfsGuard(slack, window_s, size_allowance)

    def describe(self) -> str:
        return f"guarded-aging({AgingPolicy.describe(self)}; {self.guard.describe()})"
