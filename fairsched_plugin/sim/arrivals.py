"""When each request of a simulated case arrives: as recorded (open loop), or, for a
conversation's later turns, a think time after the previous turn's answer (closed loop).

Open loop replays every arrival at its recorded time, whatever the scheduler did: a turn
may then arrive before the answer it follows. A real user sends the next turn only after
reading the answer, so under closed loop a session's turn ``k + 1`` arrives the recorded
gap between the two turns' arrivals after turn ``k`` finished (or failed): an order that
answers a session sooner brings its next turn sooner. Requests outside sessions, and first
turns, arrive as recorded in both modes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import replace

from ..experiment.case_files import WorkloadRequest


class Arrivals:
    """The case's requests in arrival order, later turns released as their sessions go."""

    def __init__(self, case: Iterable[WorkloadRequest], closed_loop: bool = False) -> None:
        self.closed_loop = closed_loop
        self._heap: list[tuple[float, int, WorkloadRequest]] = []
        self._later: dict[str, deque[tuple[float, WorkloadRequest]]] = {}
        """Under closed loop: each session's turns after the one in flight, with the think
        time before each."""
        self._session_of: dict[str, str] = {}
        previous: dict[str, float] = {}
        for seq, request in enumerate(case):
            session = request.session
            if closed_loop and session and session in previous:
                think = max(request.arrival_s - previous[session], 0.0)
                self._later.setdefault(session, deque()).append((think, request))
            else:
                self._heap.append((request.arrival_s, seq, request))
            if session:
                previous[session] = request.arrival_s
                self._session_of[request.id] = session
        heapq.heapify(self._heap)
        self._seq = len(self._heap) + sum(len(turns) for turns in self._later.values())

    def next_time(self) -> float | None:
        """When the next released request arrives (None: none is released now; under
        closed loop a turn may still follow a request in flight)."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> WorkloadRequest | None:
        """The next request arriving by ``now``, if any (ties in case order)."""
        if self._heap and self._heap[0][0] <= now:
            return heapq.heappop(self._heap)[2]
        return None

    def done(self, case_id: str, at_s: float) -> None:
        """Request ``case_id`` finished (or failed) at ``at_s``: under closed loop its
        session's next turn arrives its think time later."""
        session = self._session_of.get(case_id)
        turns = self._later.get(session) if session is not None else None
        if not turns:
            return
        think, request = turns.popleft()
        self._seq += 1
        heapq.heappush(self._heap, (at_s + think, self._seq,
                                    replace(request, arrival_s=at_s + think)))

    @property
    def exhausted(self) -> bool:
        """No request is left to arrive, released or not."""
        return not self._heap and not any(self._later.values())
