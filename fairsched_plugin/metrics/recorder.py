"""What the scheduler did, counted per engine for the ``fairsched:`` series.

Pure bookkeeping, no vLLM: the adapter (``adapter.metrics_hooks``) reports arrivals, the
requests each step schedules for the first time, requests that finish before any step
scheduled them, and the step records of the step monitor; :meth:`MetricsRecorder.snapshot`
turns the counts into the document ``metrics.snapshot`` describes. Per step the work is a
few dictionary operations on the requests the step admits.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .snapshot import SNAPSHOT_VERSION

CLASSES = ("short", "medium", "long")
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
                80.0, 160.0, 320.0, 640.0)
"""Seconds, as vLLM's queue-time buckets reach: from an idle GPU's few milliseconds to an
overloaded engine's minutes."""
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ERROR_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
"""|measured - predicted| / measured; LPRS's guard falls back above 1 by default."""
SERVED_HISTORY = 100_000
"""Steps of served prefill work kept to date a deadline's passing; older deadlines are
dated to the oldest step kept (their lateness is then a lower bound)."""


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def document(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.total}


@dataclass
class _Pending:
    arrival: float
    klass: str
    tier: str
    deadline: float | None
    seq: int
    """Order of arrival at the scheduler: vLLM's own first-come, first-served order."""
    prompt_tokens: int


class MetricsRecorder:
    """One engine's counters and its not-yet-scheduled requests."""

    def __init__(self, class_edges: tuple[int, int]) -> None:
        self.short_below, self.long_above = class_edges
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        """Requests no step has scheduled yet, in the order they reached the scheduler:
        the first is the earliest still waiting, in O(1)."""
        self._arrived = 0
        self.queue_wait: dict[tuple[str, str], Histogram] = {}
        self.abandoned: dict[tuple[str, str], int] = {}
        self.reordered = 0
        self.overdue = 0
        self.lateness = Histogram(LATENESS_BUCKETS)
        self._served: list[float] = []
        self._served_at: list[float] = []
        self.lprs_fallback_steps = {"predictor_error": 0, "guard": 0}
        self.lprs_falling_back = False
        self.lprs_error = Histogram(ERROR_BUCKETS)
        self.apc: dict[str, int] = {}
        self.steps = 0

    def request_class(self, prompt_tokens: int) -> str:
        if prompt_tokens < self.short_below:
            return "short"
        return "medium" if prompt_tokens <= self.long_above else "long"

    def on_arrival(self, req_id: str, arrival: float, prompt_tokens: int, priority: int,
                   deadline: float | None) -> None:
        self._arrived += 1
        self._pending[req_id] = _Pending(arrival, self.request_class(prompt_tokens),
                                         str(priority), deadline, self._arrived,
                                         prompt_tokens)

    def on_scheduled(self, req_ids: list[str], now: float, served: float | None) -> None:
        """``req_ids``: the requests this step admitted; those seen for the first time
        count. ``served``: the guard's served work when the step was planned; a request
        whose deadline it had passed was served late (one that found an empty queue has
        its deadline at the served work itself, and is on time)."""
        first = [(req_id, p) for req_id in req_ids
                 if (p := self._pending.pop(req_id, None)) is not None]
        if not first:
            return
        earliest_waiting = next(iter(self._pending.values())).seq if self._pending else None
        for _req_id, p in first:
            key = (p.klass, p.tier)
            histogram = self.queue_wait.get(key)
            if histogram is None:
                histogram = self.queue_wait[key] = Histogram(WAIT_BUCKETS)
            histogram.observe(max(now - p.arrival, 0.0))
            if earliest_waiting is not None and earliest_waiting < p.seq:
                self.reordered += 1
            if p.deadline is not None and served is not None and p.deadline < served:
                self.overdue += 1
                self.lateness.observe(max(now - self._passed_at(p.deadline), 0.0))

    def on_finished(self, req_id: str) -> None:
        """A request freed before any step scheduled it (aborted while waiting)."""
        p = self._pending.pop(req_id, None)
        if p is not None:
            key = (p.klass, p.tier)
            self.abandoned[key] = self.abandoned.get(key, 0) + 1

    def on_step(self, record: dict[str, Any], served: float | None, now: float) -> None:
        """A step monitor record (output back): LPRS's prediction against the measured
        time, its fallbacks, APC's decisions, and the served work for dating deadlines."""
        self.steps += 1
        if served is not None and (not self._served or served > self._served[-1]):
            if len(self._served) >= 2 * SERVED_HISTORY:
                del self._served[:SERVED_HISTORY], self._served_at[:SERVED_HISTORY]
            self._served.append(served)
            self._served_at.append(now)
        if "lprs_fallback" in record:
            if record["lprs_fallback"]:
                self.lprs_fallback_steps["predictor_error"] += 1
            self.lprs_falling_back = bool(record.get("lprs_guard"))
            if self.lprs_falling_back:
                self.lprs_fallback_steps["guard"] += 1
            predicted, measured = record.get("lprs_predicted_ms"), record.get("step_time_s")
            if predicted is not None and predicted == predicted and measured:
                measured_ms = measured * 1000.0
                self.lprs_error.observe(abs(measured_ms - predicted) / measured_ms)
        for outcome, n in (record.get("apc") or {}).items():
            self.apc[outcome] = self.apc.get(outcome, 0) + n

    def count_step(self) -> None:
        """A step no monitor reported (the monitor is off for this policy)."""
        self.steps += 1

    def _passed_at(self, deadline: float) -> float:
        """When the served work reached ``deadline`` (the first step that took it there)."""
        i = bisect_left(self._served, deadline)
        if i < len(self._served_at):
            return self._served_at[i]
        return self._served_at[-1] if self._served_at else 0.0

    def queue(self, now: float) -> dict[str, dict[str, float]]:
        """Requests not yet scheduled, by class, with their prompt tokens (the prefill
        work queued, before any prefix-cache hit) and the oldest one's wait."""
        out = {klass: {"waiting": 0, "prompt_tokens": 0, "oldest_wait_s": 0.0}
               for klass in CLASSES}
        for p in self._pending.values():
            entry = out[p.klass]
            entry["waiting"] += 1
            entry["prompt_tokens"] += p.prompt_tokens
            entry["oldest_wait_s"] = max(entry["oldest_wait_s"], now - p.arrival)
        return out

    def snapshot(self, now: float, wall: float, header: dict[str, Any],
                 failures: dict[str, int], has_deadlines: bool,
                 lprs_state: dict[str, Any] | None, apc_on: bool,
                 alpha: tuple[float | None] | None,
                 tail_watch: dict[str, float] | None = None) -> dict[str, Any]:
        """The document ``metrics.snapshot`` describes. ``header``: engine, model and
        policy; ``lprs_state``: LPRS's target and bias when it is on; ``alpha``: Aging's
        alpha, as a 1-tuple, when the policy has one; ``tail_watch``: the guard's gain,
        step-backs and last tail ratio, when it watches its tail."""
        document: dict[str, Any] = {
            "version": SNAPSHOT_VERSION,
            "time": wall,
            **header,
            "class_edges": [self.short_below, self.long_above],
            "wait_buckets": list(WAIT_BUCKETS),
            "lateness_buckets": list(LATENESS_BUCKETS),
            "error_buckets": list(ERROR_BUCKETS),
            "queue_wait": [
                {"class": klass, "tier": tier, **h.document()}
                for (klass, tier), h in sorted(self.queue_wait.items())
            ],
            "abandoned": [
                {"class": klass, "tier": tier, "count": n}
                for (klass, tier), n in sorted(self.abandoned.items())
            ],
            "reordered": self.reordered,
            "failures": dict(failures),
            "queue": self.queue(now),
            "steps": self.steps,
        }
        if has_deadlines:
            document["overdue"] = {"count": self.overdue, **self.lateness.document()}
        if alpha is not None:
            document["alpha"] = alpha[0]
        if tail_watch is not None:
            document["tail_watch"] = dict(tail_watch)
        if lprs_state is not None:
            document["lprs"] = {
                "falling_back": self.lprs_falling_back,
                "fallback_steps": dict(self.lprs_fallback_steps),
                "error": self.lprs_error.document(),
                **lprs_state,
            }
        if apc_on:
            document["apc"] = dict(self.apc)
        return document
