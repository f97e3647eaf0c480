"""The guard's check on its own effect: is the tail it serves worse than FCFS's would be?

The FCFS guard (``guarded``) bounds each request's start in *served prefill work*. Work is
not time: serving short prompts first can lower the engine's prefill rate (the decode batch
grows sooner and shares the budget), and a long prompt may take longer to prefill among
short ones. So a bound that holds in work can still leave the TTFT tail above stock's.

The watch measures that, request by request, on the engine's own clock. At arrival, FCFS
would have finished a request's prefill once the engine had served the work queued ahead
of it plus its own (``fcfs_point``, in served tokens). The instant the served-work counter
crosses that point is what FCFS would have given it on this engine's served-work
timeline; the instant its own prefill finished is what it got. The watch judges the
requests that arrived since the gain last changed, once ``window // 2`` of them have
finished their prefill and then every ``window // 4`` (keeping the last ``window``):

* **harm**: the served tail (the mean of the largest ``TAIL_SHARE`` waits, steadier than
  one order statistic) is longer than FCFS's by more than ``TOLERANCE``;
* **gain**: the mean wait is below FCFS's mean by at least ``MIN_BENEFIT``.

The guard's *gain* scales its slack beyond 1 and its size allowance: at 0 new deadlines
are the FCFS start itself (arrival order), at 1 the configured ones. It starts at 0, so
reordering is earned: a judgement that finds a gain and no harm raises it by
``RECOVERY``; one that finds harm, or no gain worth a risk to the tail, halves it (to 0
below ``MIN_GAIN``). At 0 nothing can show a gain, so every ``PROBE_AFTER`` judgements
there the gain is set to ``RECOVERY`` again to look: a probe.

Only requests that arrived under the current gain are judged, since the gain moves only
the deadlines given after it changed: a request keeps the promise made when it arrived.
Everything here is counting, O(log n) per request and O(1) per step.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection

TAIL_SHARE = 0.05
"""The share of each window whose mean is the tail compared (the worst 5%)."""
TOLERANCE = 0.02
"""How much longer than FCFS's the served tail may be before the gain is lowered."""
MIN_BENEFIT = 0.03
"""How much shorter than FCFS's the mean wait must be for reordering to be worth its risk."""
PROBE_AFTER = 2
"""Judgements at gain 0 before the watch probes again."""
MIN_GAIN = 0.125
"""A halved gain below this is 0: new requests are due at once, in arrival order."""
RECOVERY = 0.5
"""How much a judgement that finds a gain and no harm raises the gain; also a probe's."""


class TailWatch:
    """The served tail against FCFS's estimate on the same served-work timeline, and the
    gain the guard's slack and allowance are multiplied by (module docstring)."""

    def __init__(self, window: int) -> None:
        if window < 8:
            raise ValueError(f"the tail watch's window must be >= 8 requests, got {window}")
        self.window = window
        self.gain = 0.0
        self.step_backs = 0
        """Judgements that found the tail harmed and lowered the gain."""
        self.last_ratio = 0.0
        """The served tail over FCFS's at the last judgement."""
        self._epoch = 0
        """Changes of the gain so far; a request is judged only under the gain it met."""
        self._arrivals: dict[str, tuple[float, int]] = {}
        """Requests whose prefill has not finished: arrival time and the epoch then."""
        self._crossings: list[tuple[float, str]] = []
        """FCFS points not yet crossed by the served work (a heap)."""
        self._fcfs_done: dict[str, float] = {}
        """When the served work crossed each request's FCFS point."""
        self._served_done: dict[str, float] = {}
        """When each request's prefill finished, for those whose FCFS point is ahead."""
        self._served_wait: deque[float] = deque(maxlen=window)
        self._fcfs_wait: deque[float] = deque(maxlen=window)
        self._new = 0
        self._at_zero = 0

    def arrived(self, request_id: str, now: float, fcfs_point: float) -> None:
        """A request arrived; FCFS would finish its prefill at ``fcfs_point`` served tokens."""
        self._arrivals[request_id] = (now, self._epoch)
        heapq.heappush(self._crossings, (fcfs_point, request_id))

    def prefill_done(self, request_id: str, now: float) -> None:
        """The step planned at ``now`` finishes the request's prefill (once counts)."""
        if request_id not in self._arrivals or request_id in self._served_done:
            return
        fcfs = self._fcfs_done.pop(request_id, None)
        if fcfs is None:
            self._served_done[request_id] = now
        else:
            self._sample(request_id, now, fcfs)

    def served(self, now: float, served_total: float) -> None:
        """The served-work counter reached ``served_total`` with the step planned at ``now``."""
        crossings = self._crossings
        while crossings and crossings[0][0] <= served_total:
            _, request_id = heapq.heappop(crossings)
            if request_id not in self._arrivals:
                continue
            done = self._served_done.pop(request_id, None)
            if done is None:
                self._fcfs_done[request_id] = now
            else:
                self._sample(request_id, done, now)

    def forget(self, request_id: str) -> None:
        """The request left (finished or aborted): drop what is still kept of it. Its
        crossing stays in the heap until the served work passes it, then is skipped."""
        self._arrivals.pop(request_id, None)
        self._fcfs_done.pop(request_id, None)
        self._served_done.pop(request_id, None)

    def _sample(self, request_id: str, served_done: float, fcfs_done: float) -> None:
        arrival, epoch = self._arrivals.pop(request_id)
        if epoch != self._epoch:
            return
        self._served_wait.append(served_done - arrival)
        self._fcfs_wait.append(max(fcfs_done - arrival, 0.0))
        self._new += 1
        if (len(self._served_wait) >= self.window // 2
                and self._new >= self.window // 4):
            self._new = 0
            self._judge()

    def _judge(self) -> None:
        served_tail, fcfs_tail = tail_mean(self._served_wait), tail_mean(self._fcfs_wait)
        self.last_ratio = (served_tail / fcfs_tail if fcfs_tail > 0
                           else (1.0 if served_tail <= 0 else float("inf")))
        harm = served_tail > (1 + TOLERANCE) * fcfs_tail
        fcfs_mean = sum(self._fcfs_wait) / len(self._fcfs_wait)
        served_mean = sum(self._served_wait) / len(self._served_wait)
        benefit = fcfs_mean > 0 and served_mean <= (1 - MIN_BENEFIT) * fcfs_mean
        if self.gain == 0:
            self._at_zero += 1
            gain = RECOVERY if self._at_zero >= PROBE_AFTER else 0.0
        elif benefit and not harm:
            gain = min(1.0, self.gain + RECOVERY)
        else:
            gain = self.gain / 2 if self.gain / 2 >= MIN_GAIN else 0.0
            self.step_backs += harm
        if gain != self.gain:
            self.gain = gain
            self._at_zero = 0
            self._epoch += 1
            self._served_wait.clear()
            self._fcfs_wait.clear()


def tail_mean(values: Collection[float]) -> float:
    """The mean of the largest ``TAIL_SHARE`` of ``values`` (at least one)."""
    k = max(1, round(len(values) * TAIL_SHARE))
    return sum(heapq.nlargest(k, values)) / k
