"""The plan's candidates in the policy's order, each with its bound (phase 4.2 of a step, ``plan``;
the chunked-prefill paper's Algorithm 1, line 4).

A chunk rule walks them one by one, and looks ahead along the same walk under assumed
chunks; the bounds follow vLLM's own per-request limits and admission rules, so the
chunks the rule picks are ones vLLM's loop will schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .base import Rank, RequestView

Assumption = Callable[[RequestView, int], "int | None"]
"""What a chunk rule assumes a candidate takes, from its view and bound; None: look no
further."""


class CandidateWalk:
    """The candidates a chunk rule decides, in policy order: running partial prefills and
    waiting requests merged, each with its bound ``h = min(remaining, budget left)``.

    :meth:`next` gives the current candidate, :meth:`take` records its chunk. Both follow
    vLLM's admission rules, as ``plan.plan_prefill_caps`` documents: a waiting request
    whose prompt (or chunk) does not fit the free KV cache, or that gets 0, ends
    admissions.
    :meth:`upcoming` runs the same walk ahead on a copy, under assumed chunks. Waiting
    requests are pulled from their iterator only when the walk, or a look ahead, reaches
    them, and each once. ``rank`` is the policy's order in this step
    (``OrderingPolicy.ranker``).
    """

    def __init__(
        self,
        rank: Callable[[RequestView], Rank],
        running: list[tuple[Rank, RequestView]],
        waiting: Iterator[RequestView],
        left: int,
        free_kv_tokens: int,
        full_sequence_must_fit: bool,
        limits: ChunkLimits | None = None,
    ) -> None:
        self._rank = rank
        self._running = running
        self._waiting = waiting
        self._pulled: list[tuple[Rank, RequestView]] = []
        self._drained = False
        self._full = full_sequence_must_fit
        self._limits = limits or ChunkLimits()
        self._position = _Position(0, 0, True, left, free_kv_tokens)

    def next(self) -> tuple[RequestView, int, bool] | None:
        """The current candidate as ``(view, bound, waiting)``, or None: the walk is over."""
        return self._next(self._position)

    def take(self, waiting: bool, chunk: int) -> None:
        """The current candidate (from :meth:`next`) gets ``chunk``."""
        self._take(self._position, waiting, chunk)

    def upcoming(self, assume: Assumption) -> list[tuple[RequestView, int]]:
        """The current candidate and those after it, with their bounds, as the walk would
        meet them if each took ``assume(view, bound)``; up to where the walk would end or
        ``assume`` returns None (that candidate is not listed)."""
        position = self._position.copy()
        listed = []
        while (candidate := self._next(position)) is not None:
            view, bound, waiting = candidate
            chunk = assume(view, bound)
            if chunk is None:
                break
            listed.append((view, bound))
            self._take(position, waiting, chunk)
        return listed

    def _next(self, at: _Position) -> tuple[RequestView, int, bool] | None:
        running, pulled, limits = self._running, self._pulled, self._limits
        while at.left > limits.slot_cost:
            if at.waiting < len(pulled):
                head = pulled[at.waiting] if at.admitting else None
            else:
                head = None if self._drained or not at.admitting else self._pull(at.waiting)
            if head is not None and (at.index == len(running) or head[0] < running[at.index][0]):
                view = head[1]
                remaining = view.remaining_prefill
                bound = limits.bound(remaining, at.left)
                if view.admission_room(bound, self._full) > at.free_kv_tokens:
                    at.admitting = False  # vLLM stops admitting here; the rest goes to running
                    continue
                return view, bound, True
            if at.index == len(running):
                return None
            view = running[at.index][1]
            return view, limits.bound(view.remaining_prefill, at.left), False
        return None

    def _take(self, at: _Position, waiting: bool, chunk: int) -> None:
        if waiting:
            if chunk == 0:  # as vLLM's waiting loop stops at a request it cannot schedule
                at.admitting = False
                return
            at.waiting += 1
        else:
            at.index += 1
        if chunk > 0:
            at.left -= chunk + self._limits.slot_cost
            at.free_kv_tokens -= chunk

    def _pull(self, index: int) -> tuple[Rank, RequestView] | None:
        """The waiting request at ``index`` in walk order, pulling up to it."""
        pulled = self._pulled
        while len(pulled) <= index:
            view = next(self._waiting, None)
            if view is None:
                self._drained = True
                return None
            pulled.append((self._rank(view), view))
        return pulled[index]


@dataclass(frozen=True, slots=True)
class ChunkLimits:
    """What vLLM's own loop bounds each scheduled request by, besides the budget.

    ``chunk_limit``: the ``long_prefill_token_threshold`` in force this step (0: none);
    vLLM cuts any request's tokens to it. ``slot_cost``: the input budget each scheduled
    request reserves for draft tokens (speculative decoding's
    ``max_num_new_slots_for_drafting``); vLLM stops once no more than that is left.
    """

    chunk_limit: int = 0
    slot_cost: int = 0

    def bound(self, remaining: int, left: int) -> int:
        """The most a candidate with ``remaining`` prefill tokens can get from ``left``."""
        bound = min(remaining, left - self.slot_cost)
        if 0 < self.chunk_limit < bound:
            return self.chunk_limit
        return max(bound, 0)


@dataclass(slots=True)
class _Position:
    """Where a walk stands: the next running and waiting candidate, whether waiting
    requests are still admitted, the budget and the KV room left."""

    index: int
    waiting: int
    admitting: bool
    left: int
    free_kv_tokens: int

    def copy(self) -> _Position:
        return _Position(self.index, self.waiting, self.admitting, self.left,
                         self.free_kv_tokens)
