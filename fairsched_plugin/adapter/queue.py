"""A vLLM waiting queue ordered by a policy key: a heap with lazy deletion.

Insert, pop and remove cost O(log n); nothing is re-sorted per step. Aborted requests are
only marked dead (O(1)) and the heap is compacted once dead entries outnumber live ones,
so a storm of aborts cannot leave the heap growing.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

from ..policies import SortKey

_DEAD = None


class PolicyRequestQueue(RequestQueue):
    """Waiting requests, smallest policy key first.

    The key is taken once, when a request enters the queue: waiting requests make no
    progress, so a time-invariant policy key (see ``OrderingPolicy``) stays correct until
    the request leaves. A preempted request re-enters with a fresh key.
    """

    def __init__(self, key: Callable[[Request], SortKey]) -> None:
        self._key = key
        self._heap: list[list] = []
        self._entries: dict[Request, list] = {}
        self._seq = itertools.count()

    def add_request(self, request: Request) -> None:
        if request in self._entries:
            raise ValueError(f"request {request.request_id} is already waiting")
        entry = [self._key(request), next(self._seq), request]
        self._entries[request] = entry
        heapq.heappush(self._heap, entry)

    def pop_request(self) -> Request:
        self._drop_dead_head()
        if not self._heap:
            raise IndexError("pop from an empty queue")
        request = heapq.heappop(self._heap)[2]
        del self._entries[request]
        return request

    def peek_request(self) -> Request:
        self._drop_dead_head()
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][2]

    def prepend_request(self, request: Request) -> None:
        """Order is the key's, so a preempted or skipped request simply re-enters."""
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        entry = self._entries.pop(request, None)
        if entry is None:
            raise ValueError(f"request {request.request_id} is not waiting")
        entry[2] = _DEAD
        self._compact_if_sparse()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            entry = self._entries.pop(request, None)
            if entry is not None:
                entry[2] = _DEAD
        self._compact_if_sparse()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        """A snapshot in key order (vLLM iterates for stats and connector bookkeeping)."""
        return iter([entry[2] for entry in sorted(self._entries.values())])

    def iter_in_order(self) -> Generator[Request, None, None]:
        """Live requests best first, taken lazily: k requests cost O(k log n).

        The head is yielded without popping, so a consumer that looks at one request
        costs nothing; going further pops, and everything popped is put back when the
        iteration is closed or exhausted. The queue must not change while one is open.
        """
        taken: list[list] = []
        try:
            while True:
                self._drop_dead_head()
                if not self._heap:
                    return
                yield self._heap[0][2]
                taken.append(heapq.heappop(self._heap))
        finally:
            for entry in taken:
                heapq.heappush(self._heap, entry)

    def rekey(self) -> None:
        """Take every waiting request's key again (the policy's parameters changed): O(n)."""
        self._heap = []
        for request, entry in self._entries.items():
            entry[0] = self._key(request)
            self._heap.append(entry)
        heapq.heapify(self._heap)

    def _drop_dead_head(self) -> None:
        while self._heap and self._heap[0][2] is _DEAD:
            heapq.heappop(self._heap)

    def _compact_if_sparse(self) -> None:
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._heap = [entry for entry in self._heap if entry[2] is not _DEAD]
            heapq.heapify(self._heap)
