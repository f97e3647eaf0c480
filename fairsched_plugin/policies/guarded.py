"""The FCFS guard, and the two policies it bounds: ``guarded-srpf`` and ``guarded-aging``.

A request may be served out of arrival order only until FCFS would have served it, times
a slack. FCFS serves a request once the prefill work queued ahead of it when it arrived
has been done, so a request's deadline is a point in *served prefill work*, not in time:

    deadline = served at arrival + slack * max(backlog at arrival,
                                               largest backlog of the last window_s seconds)

where ``backlog`` is the prefill work queued ahead (waiting prompts and the unfinished
part of running prefills) and ``served`` counts every prefill token the engine computed.
A deadline is never earlier than one given before, so deadline order is arrival order.

The guard keeps that promise ahead of time. Before the order lets a waiting request go
ahead of one with an earlier deadline, the queue checks that every request it passes can
still start by its deadline, served earliest deadline first after it (``slack_tree``: the
EDF feasibility test, "slack stealing", O(log n)). When it cannot, the earliest deadline
becomes *due*: the guard's cutoff moves up to it, and due requests outrank every request
that is not, earliest deadline first. A new request joins the end of the EDF order with a
deadline at least its FCFS start (slack >= 1 makes every deadline feasible when set), so
no request starts later than its deadline plus one step's prefill, counted in served
work, unless a preemption puts recomputed work ahead of it. (With the tail watch at gain
0 a new request is due at once instead, so requests go in arrival order: ``tail_watch``.)
Without the check the guard only reacted once the served work had passed a deadline, and
then many requests could be overdue together and wait behind each other.

Why work and not time: the same deadline in seconds needs the prefill rate, and that rate
is not the one FCFS would have had. Serving short prompts first grows the decode batch,
whose tokens come out of the same budget, so the rate falls exactly when the queue is
long; deadlines from the rate measured at arrival come too early and, at heavy load,
nearly every request went overdue and the order collapsed into FCFS. Counted in work,
the bound needs no estimate and holds on any engine; the backlog does not depend on the
order (the same work is queued whatever the order).

The order at any instant has two lanes (due by deadline, the rest by the policy's key);
a request changes lane once, so queues keep one heap per lane (``OrderingPolicy.ranker``)
and compare deadlines with :meth:`overdue_cutoff`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..settings import FairschedConfig, GuardedAgingConfig, GuardedSRPFConfig
from .aging import AgingPolicy
from .base import OrderingPolicy, RequestView
from .tail_watch import TailWatch


class RecentExtreme:
    """The largest (or, with ``smallest``, the smallest) value observed in the last
    ``window_s`` seconds: a monotonic deque, O(1) amortised per observation."""

    def __init__(self, window_s: float, smallest: bool = False) -> None:
        self.window_s = window_s
        self._sign = -1.0 if smallest else 1.0
        self._points: deque[tuple[float, float]] = deque()

    def observe(self, now: float, value: float) -> None:
        keyed = self._sign * value
        while self._points and self._sign * self._points[-1][1] <= keyed:
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
    ``size_allowance`` times the request's own prefill work, never earlier than the last
    deadline given; and what the queues need to keep them (module docstring).

    ``served`` counts the prefill tokens scheduled, ``ahead`` the running prefills' work
    left (taken at each step's start, plus each admission since, less what was scheduled
    since), and the EDF order of
    the waiting requests starts once both are done: at :attr:`base`. ``position`` gives
    a request's place in that order (its arrival among the requests given a deadline)."""

    def __init__(self, slack: float, window_s: float, size_allowance: float = 0.0,
                 persist_s: float = 0.0, tail_window: int = 0) -> None:
        self.slack = slack
        self.size_allowance = size_allowance
        self.watch = TailWatch(tail_window) if tail_window else None
        """With a ``tail_window``: the check that steps the slack and the allowance back
        towards arrival order while the served tail is longer than FCFS's
        (``tail_watch``)."""
        self.persisting_backlog = (RecentExtreme(persist_s, smallest=True) if persist_s > 0
                                   else None)
        self.served = 0
        self.ahead = 0
        self.due = 0.0
        """Every deadline up to this is due (only ever raised)."""
        self.recent_backlog = RecentExtreme(window_s)
        self._last_deadline = 0.0
        self._positions: dict[str, int] = {}
        self._next_position = 0

    def deadline(self, backlog_tokens: int, own_tokens: int = 0,
                 request_id: str | None = None, now: float = 0.0) -> float:
        """A new request's deadline; with its ``request_id``, its place in the EDF order
        (and, with the tail watch, the start of its watch at ``now``)."""
        gain = self.gain
        if gain > 0:
            ahead = max(backlog_tokens, self.recent_backlog.value)
            earning = ahead
            if self.persisting_backlog is not None:
                earning = min(backlog_tokens, self.persisting_backlog.value)
            deadline = max(self.served + ahead + gain * (self.slack - 1.0) * earning
                           + gain * self.size_allowance * own_tokens, self._last_deadline)
        else:
            # Due at once, and so is every deadline given before it: due requests go
            # earliest deadline first, which is arrival order (a deadline at the FCFS
            # start would bound only the start, and after a step-back the deadlines
            # given under a higher gain would let the order run on).
            deadline = max(self.served, self._last_deadline)
            self.make_due(deadline)
        self._last_deadline = deadline
        if request_id is not None:
            self._positions[request_id] = self._take_position()
            if self.watch is not None:
                self.watch.arrived(request_id, now,
                                   self.served + backlog_tokens + own_tokens)
        return deadline

    @property
    def gain(self) -> float:
        """How much of the slack beyond 1 and of the size allowance new deadlines get:
        1 without the tail watch."""
        return 1.0 if self.watch is None else self.watch.gain

    def position(self, request_id: str) -> int:
        """The request's place in deadline order (a new one at the end if it has none)."""
        position = self._positions.get(request_id)
        if position is None:
            position = self._positions[request_id] = self._take_position()
        return position

    def forget(self, request_id: str, output_tokens: int = 0) -> None:
        self._positions.pop(request_id, None)
        if self.watch is not None:
            self.watch.forget(request_id, output_tokens)

    @property
    def base(self) -> int:
        """Where the waiting requests' EDF order starts, in served work."""
        return self.served + self.ahead

    @property
    def cutoff(self) -> float:
        """Requests whose deadline is at most this go first, earliest first: the served
        work (overdue) or the point the check made due, whichever is later."""
        return self.due if self.due > self.served else self.served

    def make_due(self, deadline: float) -> None:
        if deadline > self.due:
            self.due = deadline

    def admitted(self, work: int) -> None:
        """A waiting request left the queue for the running list with ``work`` to do."""
        self.ahead += work

    def observe_backlog(self, now: float, backlog_tokens: int, running_tokens: int) -> None:
        self.ahead = running_tokens
        self.recent_backlog.observe(now, backlog_tokens)
        if self.persisting_backlog is not None:
            self.persisting_backlog.observe(now, backlog_tokens)

    def observe_served(self, prefill_tokens: int, now: float = 0.0,
                       prefills_done: Sequence[str] = ()) -> None:
        """A step was scheduled at ``now`` with ``prefill_tokens``, all of them running
        prefills' (the ones admitted in it included), so the work ahead of the queue
        shrinks by as much as the served work grows (``base`` holds); it finishes the
        prefill of ``prefills_done``."""
        self.served += prefill_tokens
        self.ahead = max(self.ahead - prefill_tokens, 0)
        watch = self.watch
        if watch is not None:
            for request_id in prefills_done:
                watch.prefill_done(request_id, now)
            watch.served(now, self.served)

    def describe(self) -> str:
        window = self.recent_backlog.window_s
        return (f"due after slack={self.slack:g} x the FCFS backlog"
                + (f" (largest of the last {window:g} s)" if window else "")
                + (f" + {self.size_allowance:g} x its own prefill" if self.size_allowance
                   else "")
                + ", passed only while EDF stays feasible"
                + (f"; stepped back towards arrival order while the TTFT or TPOT tail of "
                   f"the last {self.watch.window} requests is longer than FCFS's"
                   if self.watch is not None else ""))

    def _take_position(self) -> int:
        position = self._next_position
        self._next_position += 1
        return position


class _Guarded:
    """What both guarded policies share: deadlines from an :class:`FcfsGuard`."""

    uses_deadlines = True
    guard: FcfsGuard

    @property
    def admission_guard(self) -> FcfsGuard:
        return self.guard

    def deadline(self, now: float, backlog_tokens: int, own_tokens: int,
                 request_id: str | None = None) -> float:
        return self.guard.deadline(backlog_tokens, own_tokens, request_id, now)

    def forget_request(self, request_id: str, output_tokens: int = 0) -> None:
        self.guard.forget(request_id, output_tokens)

    def overdue_cutoff(self, now: float) -> float:
        return self.guard.cutoff

    def served_work(self, now: float) -> float:
        return self.guard.served

    def observe_backlog(self, now: float, backlog_tokens: int, running_tokens: int = 0) -> None:
        self.guard.observe_backlog(now, backlog_tokens, running_tokens)

    def observe_step(self, prefill_tokens: int, now: float = 0.0,
                     prefills_done: Sequence[str] = ()) -> None:
        self.guard.observe_served(prefill_tokens, now, prefills_done)


class GuardedSRPF(_Guarded, OrderingPolicy):
    """Shortest remaining prefill first until a request's FCFS-derived deadline passes.

    Shortest remaining prefill first minimises how long the typical request queues for the
    budget, but alone it lets a long prompt wait behind every shorter one that keeps
    arriving; the guard bounds that."""

    name = "guarded-srpf"
    orders_decodes = False
    key_follows_remaining_work = True

    def __init__(self, config: GuardedSRPFConfig) -> None:
        self.guard = FcfsGuard(config.slack, config.window_s, config.size_allowance,
                               config.persist_s, config.tail_window)
        self.running_first = not config.overtake_running

    def value(self, view: RequestView) -> float:
        return view.remaining_prefill

    def describe(self) -> str:
        return (f"guarded-srpf(shortest remaining prefill first"
                + ("" if self.running_first else ", running prefills overtaken")
                + f"; {self.guard.describe()})")


class GuardedAging(_Guarded, AgingPolicy):
    """The chunked-prefill paper's Aging order with the automatic alpha, inside the FCFS guard.

    The two protect the tail at different loads. With short queues (bursts at moderate
    load) Aging's age term lets a long prompt overtake younger short ones within a few of
    its own prefill times, which the guard alone allows too late; with long queues the age
    term is nearly arrival order, and the guard's slack is what lets short prompts ahead."""

    name = "guarded-aging"

    def __init__(self, config: GuardedAgingConfig, epoch: float = 0.0) -> None:
        AgingPolicy.__init__(self, alpha=None, epoch=epoch, auto_factor=config.auto_factor)
        self.guard = FcfsGuard(config.slack, config.window_s, config.size_allowance,
                               config.persist_s)

    @classmethod
    def from_settings(cls, section: GuardedAgingConfig, config: FairschedConfig,
                      epoch: float) -> GuardedAging:
        return cls(section, epoch)

    def describe(self) -> str:
        return f"guarded-aging({AgingPolicy.describe(self)}; {self.guard.describe()})"
