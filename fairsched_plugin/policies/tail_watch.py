"""The guard's check on its own effect: are the tails it serves worse than FCFS's would be?

The FCFS guard (``guarded``) bounds each request's start in *served prefill work*. Work is
not time: serving short prompts first can lower the engine's prefill rate (the decode batch
grows sooner and shares the budget), and a long prompt may take longer to prefill among
short ones. So a bound that holds in work can still leave the TTFT tail above stock's.
And a short prompt served ahead of a long one decodes through the long one's prefill
steps, which FCFS would have run before it started: its time per output token grows.

The watch measures both, request by request, on the engine's own clock. At arrival, FCFS
would have finished a request's prefill once the engine had served the work queued ahead
of it plus its own (``fcfs_point``, in served tokens). The instant the served-work counter
crosses that point is what FCFS would have given it on this engine's served-work
timeline; the instant its own prefill finished is what it got. Its decode of ``n`` tokens
took the ``n`` steps after that instant; under FCFS it would have taken the ``n`` steps
after the crossing, so the mean length of those steps is FCFS's time per output token on
the same timeline, and the mean of the first ``n`` is what it got. Every
``window // JUDGE_SHARE`` requests (keeping the last ``window``) the watch judges:

* **harm**: with ``window // 4`` waits, their tail (the mean of the largest
  ``TAIL_SHARE``, steadier than one order statistic) is longer than FCFS's by more than
  ``TOLERANCE``; or, with ``window // 2`` decodes, their time-per-token tail is;
* **gain**: with ``window // 2`` waits, their mean is below FCFS's by ``MIN_BENEFIT``.

The guard's *gain* scales its slack beyond 1 and its size allowance: at 0 new deadlines
are due at once (arrival order, as stock vLLM serves it), at 1 the configured ones. The
gain starts at 0 and is earned as a sender earns its window: a probe sets it to
``MIN_GAIN``, where the guard's slack can move a wait by a few percent at most; each
judgement that finds a gain and no harm doubles it; one that finds no gain halves it (to
0 below ``MIN_GAIN``); any harm sends it back to 0 at once. At 0 the watch probes again
after ``PROBE_AFTER`` judgements, twice as many after each harm (up to ``MAX_BACKOFF``
doublings, undone by a probe that finds a gain), so traffic where reordering harms is
mostly served in arrival order.

Only requests that arrived under the current gain are judged for their wait, since the
gain moves only the deadlines given after it changed: a request keeps the promise made
when it arrived. A decode is judged if it finished under the current gain, since the
steps it ran through were ordered under it. Everything here is counting: O(log n) per
request, O(1) per step amortised, and the step times kept reach back only to the
oldest request still to be judged.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Collection

TAIL_SHARE = 0.05
"""The share of each window whose mean is the tail compared (the worst 5%)."""
TOLERANCE = 0.02
"""How much longer than FCFS's the served tail may be before the gain is lowered."""
MIN_BENEFIT = 0.03
"""How much shorter than FCFS's the mean wait must be for reordering to be worth its risk."""
JUDGE_SHARE = 8
"""The watch judges every ``window // JUDGE_SHARE`` requests."""
PROBE_AFTER = 6
"""Judgements at gain 0 before the watch probes, doubled after each harm (up to
``MAX_BACKOFF`` times) and reset by a probe that found a gain."""
MAX_BACKOFF = 4
MIN_GAIN = 0.125
"""A probe's gain; a halved gain below this is 0."""
PRUNE_EVERY = 1024
"""Steps between prunings of the step times kept."""


class TailWatch:
    """The served tail against FCFS's estimate on the same served-work timeline, and the
    gain the guard's slack and allowance are multiplied by (module docstring)."""

    def __init__(self, window: int) -> None:
        if window < 8:
            raise ValueError(f"the tail watch's window must be >= 8 requests, got {window}")
        self.window = window
        self.gain = 0.0
        self.step_backs = 0
        """Judgements that found a tail harmed and sent the gain back to 0."""
        self.last_ratio = 0.0
        """At the last judgement, the served tail over FCFS's: of TTFT, or of the time per
        output token where that one was further above FCFS's."""
        self.last_measure = "TTFT"
        """Which tail ``last_ratio`` is of: ``"TTFT"`` or ``"TPOT"``."""
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
        self._backoff = 0
        self._step = 0
        """Steps planned so far; step ``j`` was planned at ``_times[j - _times_base]``."""
        self._times = array("d")
        self._times_base = 0
        self._first_step: dict[str, int] = {}
        """The step that finished each live request's prefill (its first token)."""
        self._cross_step: dict[str, int] = {}
        """The step whose served work crossed each live request's FCFS point."""
        self._uncrossed: dict[str, tuple[int, int, int]] = {}
        """Decodes finished before the served work crossed their FCFS point: first step,
        tokens after the first, and the epoch they finished in."""
        self._decodes: list[tuple[int, str, int, int, int, int]] = []
        """Finished decodes waiting for the steps both estimates read (a heap on the step
        that completes them): that step, id, first step, crossing step, tokens, epoch."""
        self._served_tpot: deque[float] = deque(maxlen=window)
        self._fcfs_tpot: deque[float] = deque(maxlen=window)

    def arrived(self, request_id: str, now: float, fcfs_point: float) -> None:
        """A request arrived; FCFS would finish its prefill at ``fcfs_point`` served tokens."""
        self._arrivals[request_id] = (now, self._epoch)
        heapq.heappush(self._crossings, (fcfs_point, request_id))

    def prefill_done(self, request_id: str, now: float) -> None:
        """The step planned at ``now`` finishes the request's prefill (once counts)."""
        if request_id not in self._arrivals or request_id in self._served_done:
            return
        self._first_step.setdefault(request_id, self._step)
        fcfs = self._fcfs_done.pop(request_id, None)
        if fcfs is None:
            self._served_done[request_id] = now
        else:
            self._sample(request_id, now, fcfs)

    def served(self, now: float, served_total: float) -> None:
        """The served-work counter reached ``served_total`` with the step planned at ``now``
        (called once for every step, decode-only steps included)."""
        step = self._step
        self._times.append(now)
        self._step = step + 1
        crossings = self._crossings
        while crossings and crossings[0][0] <= served_total:
            _, request_id = heapq.heappop(crossings)
            if request_id in self._arrivals or request_id in self._first_step:
                self._cross_step[request_id] = step
            finished = self._uncrossed.pop(request_id, None)
            if finished is not None:
                first, tokens, epoch = finished
                self._await_decode(request_id, first, step, tokens, epoch)
            if request_id not in self._arrivals:
                continue
            done = self._served_done.pop(request_id, None)
            if done is None:
                self._fcfs_done[request_id] = now
            else:
                self._sample(request_id, done, now)
        decodes = self._decodes
        while decodes and decodes[0][0] <= step:
            _, _, first, cross, tokens, epoch = heapq.heappop(decodes)
            if epoch == self._epoch:
                self._served_tpot.append(self._mean_step(first, tokens))
                self._fcfs_tpot.append(self._mean_step(cross, tokens))
        if step % PRUNE_EVERY == PRUNE_EVERY - 1:
            self._prune()

    def forget(self, request_id: str, output_tokens: int = 0) -> None:
        """The request left (finished or aborted) with ``output_tokens``: drop what is
        still kept of it, and judge its decode once the steps both estimates read are
        planned. Its crossing stays in the heap until the served work passes it."""
        self._arrivals.pop(request_id, None)
        self._fcfs_done.pop(request_id, None)
        self._served_done.pop(request_id, None)
        first = self._first_step.pop(request_id, None)
        cross = self._cross_step.pop(request_id, None)
        tokens = output_tokens - 1
        if first is None or tokens < 1:
            return
        if cross is None:
            self._uncrossed[request_id] = (first, tokens, self._epoch)
        else:
            self._await_decode(request_id, first, cross, tokens, self._epoch)

    def _await_decode(self, request_id: str, first: int, cross: int, tokens: int,
                      epoch: int) -> None:
        heapq.heappush(self._decodes,
                       (max(first, cross) + tokens, request_id, first, cross, tokens, epoch))

    def _mean_step(self, start: int, tokens: int) -> float:
        """The mean length of the ``tokens`` steps after step ``start``."""
        base = self._times_base
        return (self._times[start + tokens - base] - self._times[start - base]) / tokens

    def _prune(self) -> None:
        """Forget step times no request still to be judged will read."""
        oldest = min((*self._first_step.values(), *self._cross_step.values(),
                      *(first for first, _, _ in self._uncrossed.values()),
                      *(min(entry[2], entry[3]) for entry in self._decodes)),
                     default=self._step)
        if oldest > self._times_base:
            del self._times[:oldest - self._times_base]
            self._times_base = oldest

    def _sample(self, request_id: str, served_done: float, fcfs_done: float) -> None:
        arrival, epoch = self._arrivals.pop(request_id)
        if epoch != self._epoch:
            return
        self._served_wait.append(served_done - arrival)
        self._fcfs_wait.append(max(fcfs_done - arrival, 0.0))
        self._new += 1
        if self._new >= max(1, self.window // JUDGE_SHARE):
            self._new = 0
            self._judge()

    def _judge(self) -> None:
        self.last_ratio, self.last_measure = 1.0, "TTFT"
        if len(self._served_wait) >= self.window // 4:
            self.last_ratio = _ratio(tail_mean(self._served_wait), tail_mean(self._fcfs_wait))
        if len(self._served_tpot) >= self.window // 2:
            tpot_ratio = _ratio(tail_mean(self._served_tpot), tail_mean(self._fcfs_tpot))
            if tpot_ratio > self.last_ratio:
                self.last_ratio, self.last_measure = tpot_ratio, "TPOT"
        harm = self.last_ratio > 1 + TOLERANCE
        gain = self.gain
        if gain == 0:
            self._at_zero += 1
            if self._at_zero >= PROBE_AFTER << self._backoff:
                gain = MIN_GAIN
        elif harm:
            gain = 0.0
            self.step_backs += 1
            self._backoff = min(self._backoff + 1, MAX_BACKOFF)
        elif len(self._served_wait) >= self.window // 2:
            fcfs_mean = sum(self._fcfs_wait) / len(self._fcfs_wait)
            served_mean = sum(self._served_wait) / len(self._served_wait)
            if fcfs_mean > 0 and served_mean <= (1 - MIN_BENEFIT) * fcfs_mean:
                gain = min(1.0, 2 * gain)
                self._backoff = 0
            else:
                gain = gain / 2 if gain / 2 >= MIN_GAIN else 0.0
        if gain != self.gain:
            self.gain = gain
            self._at_zero = 0
            self._epoch += 1
            self._served_wait.clear()
            self._fcfs_wait.clear()
            self._served_tpot.clear()
            self._fcfs_tpot.clear()


def _ratio(served: float, fcfs: float) -> float:
    if fcfs > 0:
        return served / fcfs
    return 1.0 if served <= 0 else float("inf")


def tail_mean(values: Collection[float]) -> float:
    """The mean of the largest ``TAIL_SHARE`` of ``values`` (at least one)."""
    k = max(1, round(len(values) * TAIL_SHARE))
    return sum(heapq.nlargest(k, values)) / k
