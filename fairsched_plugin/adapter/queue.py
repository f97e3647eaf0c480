"""A vLLM waiting queue ordered by a policy key: a heap with lazy deletion.

Insert, pop and remove cost O(log n); nothing is re-sorted per step. Aborted requests are
only marked dead (O(1)) and the heaps are compacted once dead entries outnumber live ones,
so a storm of aborts cannot leave a heap growing.

For a policy with deadlines (``OrderingPolicy.uses_deadlines``) the order changes with
time, but only in one way: a request moves to the overdue lane once, when its deadline
passes. So the queue keeps a second heap on deadlines and, at each look, serves its head
first while that deadline has passed; no request is ever re-keyed for the time.

With the policy's admission guard (``guarded.FcfsGuard``) the queue also keeps its
requests' deadlines and work in EDF order (``policies.slack_tree``): before the key's head
goes ahead of requests with earlier deadlines, it checks they keep enough slack to absorb
its work, and where they do not, the guard makes the earliest deadline due (the overdue
lane serves it first). The head is looked at this way both when vLLM pops and when the
plan iterates, so both meet the same order.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

from ..policies import SortKey
from ..policies.guarded import FcfsGuard
from ..policies.slack_tree import SlackTree

_DEAD = None

# Heap entries are flat lists: ``[*key, seq, request]`` in the key heap and
# ``[deadline, seq, request]`` in the overdue lane. Flat, a comparison meets the deciding
# float at once (a nested key tuple costs three more rich comparisons), which halves the
# cost of a pop; a list, so an abort can mark its request dead in place.
_SEQ, _REQUEST = -2, -1


class _ReenterByKey(RequestQueue):
    """A queue whose order is its keys': a preempted or skipped request that vLLM puts
    back "in front" simply re-enters under its key."""

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)


class PolicyRequestQueue(_ReenterByKey):
    """Waiting requests, smallest policy key first (overdue ones first, with deadlines).

    What the policy knows of a request is taken once, when it enters the queue: its
    ``snapshot`` (the scheduler's ``RequestView``). Waiting requests make no progress, so
    a time-invariant policy key (see ``OrderingPolicy``) of that snapshot stays correct
    until the request leaves; a preempted request re-enters with a fresh one. The key,
    deadline and work all read the one snapshot, and a re-key reads it again instead of
    the request: rebuilding every view was most of a re-key's cost, paid on the engine's
    path each time the automatic alpha moves (and every step under ``hrrn``).

    Args:
        key: the policy key of a request's snapshot.
        deadline: with a deadline policy, the snapshot's deadline; ``clock`` then gives
            the instant the order is taken at (the scheduler's step time).
        work: the prefill tokens a waiting request still needs, from its snapshot; the
            queue keeps their sum (:attr:`work`) for deadline estimates.
        snapshot: what the other three read; None: the request itself.
        guard: with deadlines, the policy's admission guard: the queue then passes a
            request ahead of earlier deadlines only while they stay feasible.
    """

    def __init__(
        self,
        key: Callable[[Any], SortKey],
        deadline: Callable[[Any], float] | None = None,
        clock: Callable[[], float] | None = None,
        work: Callable[[Any], int] | None = None,
        snapshot: Callable[[Request], Any] | None = None,
        guard: FcfsGuard | None = None,
    ) -> None:
        if (deadline is None) != (clock is None):
            raise ValueError("a deadline queue needs both deadline and clock")
        self._key = key
        self._deadline = deadline
        self._clock = clock
        self._work = work
        self._snapshot = snapshot
        if guard is not None and (deadline is None or work is None):
            raise ValueError("an admission guard needs deadlines and work")
        self._guard = guard
        self._slack = SlackTree() if guard is not None else None
        self._passing = 0
        """Work taken ahead of the queue by an iteration in progress (not admitted)."""
        self._heap: list[list] = []
        self._overdue_heap: list[list] | None = [] if deadline is not None else None
        # request -> (key entry, deadline entry or None, work, snapshot, EDF position)
        self._entries: dict[Request, tuple[list, list | None, int, Any, int]] = {}
        self._seq = itertools.count()
        self.work = 0
        self.changes = 0
        """Counts insertions and re-keys: the events after which a request may rank
        ahead of every one queued before (pops and removals only take requests away)."""
        self.last_popped: tuple[Request, Any] | None = None
        """The request popped last and its snapshot: the head of the queue then."""

    def add_request(self, request: Request) -> None:
        if request in self._entries:
            raise ValueError(f"request {request.request_id} is already waiting")
        snapshot = self._snapshot(request) if self._snapshot is not None else request
        seq = next(self._seq)
        entry = [*self._key(snapshot), seq, request]
        heapq.heappush(self._heap, entry)
        timed = None
        if self._overdue_heap is not None:
            assert self._deadline is not None
            timed = [self._deadline(snapshot), seq, request]
            heapq.heappush(self._overdue_heap, timed)
        work = self._work(snapshot) if self._work is not None else 0
        self.work += work
        self.changes += 1
        position = -1
        if self._guard is not None:
            position = self._guard.position(request.request_id)
            self._slack.put(position, timed[0], work)
        self._entries[request] = (entry, timed, work, snapshot, position)

    def pop_request(self) -> Request:
        heap = self._head_heap()
        if not heap:
            raise IndexError("pop from an empty queue")
        request = heapq.heappop(heap)[_REQUEST]
        entry = self._entries[request]
        self.last_popped = request, entry[3]
        if self._guard is not None:
            self._guard.admitted(entry[2])
        self._forget(request)
        self._compact_if_sparse()
        return request

    def peek_request(self) -> Request:
        heap = self._head_heap()
        if not heap:
            raise IndexError("peek from an empty queue")
        return heap[0][_REQUEST]

    def peek_keyed(self) -> tuple[Request, SortKey | None]:
        """The request served next and the key it is queued under, or None for the key
        when it is served from the overdue lane (its deadline decides there)."""
        heap = self._head_heap()
        if not heap:
            raise IndexError("peek from an empty queue")
        entry = heap[0]
        return entry[_REQUEST], (None if heap is self._overdue_heap else tuple(entry[:_SEQ]))

    def remove_request(self, request: Request) -> None:
        if request not in self._entries:
            raise ValueError(f"request {request.request_id} is not waiting")
        self._forget(request)
        self._compact_if_sparse()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            if request in self._entries:
                self._forget(request)
        self._compact_if_sparse()

    def holds(self, request: Request) -> bool:
        return request in self._entries

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        """A snapshot in order (vLLM iterates for stats and connector bookkeeping)."""
        return iter(list(self.iter_in_order()))

    def iter_in_order(self) -> Generator[Request, None, None]:
        """Live requests best first, taken lazily: k requests cost O(k log n).

        The head is yielded without popping, so a consumer that looks at one request
        costs nothing; going further pops, and everything popped is put back when the
        iteration is closed or exhausted. The queue must not change while one is open.
        Under an admission guard each request yielded counts as served ahead of the
        rest, as if vLLM had admitted it, so the guard's checks meet what they would.
        """
        taken: list[tuple[list, list]] = []
        passed: list[tuple[int, float, int]] = []
        try:
            if self._guard is None:
                yield from self._iter_by_lanes(taken)
            else:
                yield from self._iter_guarded(taken, passed)
        finally:
            for heap, entry in taken:
                heapq.heappush(heap, entry)
            for position, deadline, work in passed:
                self._slack.put(position, deadline, work)
            self._passing = 0

    def _iter_by_lanes(self, taken: list[tuple[list, list]]) -> Generator[Request, None, None]:
        """Every overdue request by deadline, then the rest by key."""
        now = self._clock() if self._clock is not None else None
        overdue: set[int] = set()
        if self._overdue_heap is not None:
            heap = self._overdue_heap
            while True:
                self._clean_top(heap)
                if not heap or heap[0][0] > now:
                    break
                overdue.add(heap[0][_SEQ])
                yield heap[0][_REQUEST]
                taken.append((heap, heapq.heappop(heap)))
        heap = self._heap
        while True:
            self._clean_top(heap)
            if not heap:
                return
            if heap[0][_SEQ] not in overdue:
                yield heap[0][_REQUEST]
            taken.append((heap, heapq.heappop(heap)))

    def _iter_guarded(self, taken: list[tuple[list, list]],
                      passed: list[tuple[int, float, int]]) -> Generator[Request, None, None]:
        """The order :meth:`_head_heap` serves, one request after another: each request
        yielded is taken out of both heaps and out of the slack tree (into ``taken`` and
        ``passed``, for the caller to put back), its work counted as passing."""
        lane, heap = self._overdue_heap, self._heap
        seen: set[int] = set()
        while True:
            self._clean_top(lane, seen, taken)
            if lane and lane[0][0] <= self._clock():
                source = lane
            else:
                self._clean_top(heap, seen, taken)
                if not heap:
                    return
                if not self._may_pass(heap[0], seen, taken):
                    continue
                source = heap
            request = source[0][_REQUEST]
            yield request
            seen.add(source[0][_SEQ])
            taken.append((source, heapq.heappop(source)))
            _key, timed, work, _snapshot, position = self._entries[request]
            self._slack.remove(position)
            passed.append((position, timed[0], work))
            self._passing += work

    @staticmethod
    def _clean_top(heap: list[list], seen: set[int] | None = None,
                   taken: list[tuple[list, list]] | None = None) -> None:
        """Drop dead entries off the top of ``heap``, and take the ``seen`` ones into
        ``taken`` (an iteration's)."""
        while heap:
            top = heap[0]
            if top[_REQUEST] is _DEAD:
                heapq.heappop(heap)
            elif seen and top[_SEQ] in seen:
                taken.append((heap, heapq.heappop(heap)))
            else:
                return

    def _may_pass(self, entry: list, seen: set[int] | None = None,
                  taken: list[tuple[list, list]] | None = None) -> bool:
        """Whether the key's head (``entry``) can go ahead of every request with an earlier
        deadline and leave each its start by its deadline; if not, the earliest deadline
        is made due (the caller then serves the overdue lane's head)."""
        _key, _timed, work, _snapshot, position = self._entries[entry[_REQUEST]]
        guard = self._guard
        if self._slack.least_slack_before(position) - guard.base - self._passing >= work:
            return True
        lane = self._overdue_heap
        self._clean_top(lane, seen, taken)
        guard.make_due(lane[0][0])
        return False

    def earliest_deadline(self) -> float:
        """The earliest deadline of a waiting request; infinite without deadlines."""
        lane = self._overdue_heap
        if lane is None:
            return math.inf
        self._clean_top(lane)
        return lane[0][0] if lane else math.inf

    def rekey(self) -> None:
        """Take every waiting request's key again, from its snapshot (the policy's
        parameters changed): O(n). Deadlines are fixed at arrival and stay."""
        key = self._key
        self.changes += 1
        self._heap = []
        append = self._heap.append
        for entry, _timed, _work, snapshot, _position in self._entries.values():
            entry[:_SEQ] = key(snapshot)
            append(entry)
        heapq.heapify(self._heap)

    def _head_heap(self) -> list[list]:
        """The heap whose head is served next: the overdue lane's while its first live
        entry's deadline has passed, else the key heap (possibly empty).

        A dead entry on top of the overdue lane is dropped only once its deadline has
        passed: before that every entry below it is later still, so no request is
        overdue, and the compaction clears it at no cost per admission (every request
        served from the key heap leaves one there, popped 13 levels deep at 10,000
        waiting)."""
        self._clean_top(self._heap)
        overdue = self._overdue_heap
        if overdue is None:
            return self._heap
        while True:
            cutoff = self._clock()
            while overdue and overdue[0][0] <= cutoff:
                if overdue[0][_REQUEST] is not _DEAD:
                    return overdue
                heapq.heappop(overdue)
            if self._guard is None or not self._heap or self._may_pass(self._heap[0]):
                return self._heap

    def _forget(self, request: Request) -> None:
        entry, timed, work, _snapshot, position = self._entries.pop(request)
        entry[_REQUEST] = _DEAD
        if timed is not None:
            timed[_REQUEST] = _DEAD
        if self._slack is not None:
            self._slack.remove(position)
        self.work -= work

    def _compact_if_sparse(self) -> None:
        limit = 2 * len(self._entries) + 64
        if len(self._heap) > limit:
            self._heap = self._live(self._heap)
        if self._overdue_heap is not None and len(self._overdue_heap) > limit:
            self._overdue_heap = self._live(self._overdue_heap)

    @staticmethod
    def _live(heap: list[list]) -> list[list]:
        live = [entry for entry in heap if entry[_REQUEST] is not _DEAD]
        heapq.heapify(live)
        return live


class PriorityLevelQueue(_ReenterByKey):
    """vLLM's ``--scheduling-policy priority`` composed with a policy: the request's
    priority orders first (smaller first, as in vLLM), the policy's key within a level.

    One :class:`PolicyRequestQueue` per priority level in use, so each level keeps its
    own heaps (and overdue lane): a deadline never lifts a request above a better
    priority, and nothing is re-keyed when levels come and go.
    """

    def __init__(self, make_level: Callable[[], PolicyRequestQueue]) -> None:
        self._make_level = make_level
        self._levels: dict[int, PolicyRequestQueue] = {}
        self._order: list[int] = []

    @property
    def work(self) -> int:
        return sum(level.work for level in self._levels.values())

    def add_request(self, request: Request) -> None:
        level = self._levels.get(request.priority)
        if level is None:
            level = self._levels[request.priority] = self._make_level()
            self._order = sorted(self._levels)
        level.add_request(request)

    def pop_request(self) -> Request:
        level, queue = self._head()
        request = queue.pop_request()
        self._drop_if_empty(level)
        return request

    def peek_request(self) -> Request:
        return self._head()[1].peek_request()

    def remove_request(self, request: Request) -> None:
        queue = self._levels.get(request.priority)
        if queue is None:
            raise ValueError(f"request {request.request_id} is not waiting")
        queue.remove_request(request)
        self._drop_if_empty(request.priority)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            queue = self._levels.get(request.priority)
            if queue is not None:
                queue.remove_requests((request,))
                self._drop_if_empty(request.priority)

    def holds(self, request: Request) -> bool:
        level = self._levels.get(request.priority)
        return level is not None and level.holds(request)

    def __bool__(self) -> bool:
        return bool(self._levels)

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self.iter_in_order()))

    def iter_in_order(self) -> Generator[Request, None, None]:
        """Levels in priority order, each in its own order (see
        :meth:`PolicyRequestQueue.iter_in_order`; the same rules about closing)."""
        for level in list(self._order):
            with closing(self._levels[level].iter_in_order()) as requests:
                yield from requests

    def rekey(self) -> None:
        for level in self._levels.values():
            level.rekey()

    def _head(self) -> tuple[int, PolicyRequestQueue]:
        if not self._order:
            raise IndexError("the queue is empty")
        level = self._order[0]
        return level, self._levels[level]

    def _drop_if_empty(self, level: int) -> None:
        if not self._levels[level]:
            del self._levels[level]
            self._order.remove(level)
