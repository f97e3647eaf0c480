"""The per-step prefill plan: how the residual token budget flows in policy order.

vLLM serves its running list before it admits anything from the waiting queue, so a
policy that ranks a newly arrived request above a running partial prefill must hold that
partial prefill back. The plan decides, before vLLM's own loop runs, how many tokens each
running partial prefill may take: decodes are served first, then every prefill candidate,
running and waiting alike, takes ``min(remaining, budget left)`` in policy order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from .base import OrderingPolicy, Rank, RequestView


Assumption = Callable[[RequestView, int], "int | None"]
"""What a chunk rule assumes a candidate takes, from its view and bound; None: look no
further."""


class ChunkRule(Protocol):
    """Decides a prefill candidate's chunk inside the plan (LPRS, APC, alignment)."""

    def choose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """The chunk for ``view``, at most ``bound`` (the feasible ``h``); 0 skips it.
        ``walk.upcoming`` lists this candidate and the ones after it, so a rule can
        prepare the work of several candidates in one go."""


class CandidateWalk:
    """The candidates a chunk rule decides, in policy order: running partial prefills and
    waiting requests merged, each with its bound ``h = min(remaining, budget left)``.

    :meth:`next` gives the current candidate, :meth:`take` records its chunk. Both follow
    vLLM's admission rules, as ``plan_prefill_caps`` documents: a waiting request whose
    prompt (or chunk) does not fit the free KV cache, or that gets 0, ends admissions.
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
                if (remaining if self._full else bound) > at.free_kv_tokens:
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


def step_rank(policy: OrderingPolicy, now: float,
              by_priority: bool = False) -> Callable[[RequestView], Rank]:
    """The order of one step: the policy's at ``now``, under vLLM's priority scheduling
    within the request's priority (smaller first, as vLLM orders it)."""
    rank = policy.ranker(now)
    if not by_priority:
        return rank
    return lambda view: (view.vllm_priority, rank(view))


def plan_prefill_caps(
    policy: OrderingPolicy,
    running_prefills: Iterable[RequestView],
    waiting_in_order: Iterable[RequestView],
    decode_tokens: int,
    token_budget: int,
    free_slots: int,
    free_kv_tokens: int,
    full_sequence_must_fit: bool = True,
    rule: ChunkRule | None = None,
    now: float = 0.0,
    limits: ChunkLimits | None = None,
    by_priority: bool = False,
) -> dict[str, int]:
    """Token caps for the prefill candidates the residual budget reaches.

    Args:
        policy: the ordering; ``waiting_in_order`` must already follow its order at
            ``now`` (:func:`step_rank`).
        running_prefills: running requests with prefill work left (any order).
        waiting_in_order: the waiting requests vLLM's waiting loop can admit this step,
            best first; consumed lazily and only as far as needed, so a long queue costs
            nothing beyond the requests that get budget.
        decode_tokens: tokens (and draft slots) the decodes of this step take before any
            prefill.
        token_budget: the step's hard budget (``max_num_scheduled_tokens``, or less when
            the input budget is smaller).
        free_slots: how many waiting requests may still be admitted (running slots).
        free_kv_tokens: KV-cache room for new tokens. vLLM stops admitting at the first
            waiting request whose blocks cannot be allocated, so from there on the plan
            gives the budget to running prefills only; otherwise a running prefill could
            be held back for a waiting request that never gets in, and with no decodes
            left to free blocks, never progress.
        full_sequence_must_fit: vLLM's ``scheduler_reserve_full_isl``: a waiting request is
            admitted only if its whole prompt fits, not just its first chunk.
        rule: without one, each candidate takes what vLLM's loop would give it (vLLM's
            token-budget rule). With one, the rule picks every chunk, waiting requests'
            included, along a :class:`CandidateWalk`, and the first waiting candidate that
            gets 0 ends admissions for the step, as vLLM's waiting loop stops at a
            request it cannot schedule.
        now: the wall-clock time the order is taken at (it matters only to a policy with
            deadlines).
        limits: vLLM's per-request bounds (long-prefill threshold, draft slots).
        by_priority: vLLM's priority scheduling is on: the request's priority orders
            first, the policy within a priority.

    Returns:
        ``{request_id: cap}`` for every running prefill (0 means "not this step") and,
        with a rule, for the waiting requests it decided (0: admissions end there). The
        plan is never exclusive: a request it has no cap for (a waiting request past the
        point the plan reached) takes whatever budget vLLM's loop still has, so budget
        a planned request could not use (a failed allocation, a prefix-cache hit) still
        goes to work. Without a rule, waiting requests get no cap: vLLM admits them in
        queue order after the running loop, so whatever the plan kept free reaches them.
    """
    limits = limits or ChunkLimits()
    rank = step_rank(policy, now, by_priority)
    running = sorted((rank(view), view) for view in running_prefills)
    caps = {view.request_id: 0 for _key, view in running}
    left = max(token_budget - decode_tokens, 0)
    if left <= limits.slot_cost or (rule is None and not running):
        return caps
    waiting = itertools.islice(waiting_in_order, max(free_slots, 0))
    if rule is not None:
        walk = CandidateWalk(rank, running, waiting, left, free_kv_tokens,
                             full_sequence_must_fit, limits)
        while (candidate := walk.next()) is not None:
            view, bound, is_waiting = candidate
            chunk = rule.choose(view, bound, walk)
            caps[view.request_id] = chunk
            walk.take(is_waiting, chunk)
        return caps
    # The token-budget rule: a two-way merge of the two streams in policy order, ties to
    # the running request, until the last running prefill has its cap.
    candidate = next(waiting, None)
    candidate_key = rank(candidate) if candidate is not None else None
    index = 0
    while left > limits.slot_cost and index < len(running):
        if candidate is not None and candidate_key < running[index][0]:
            bound = limits.bound(candidate.remaining_prefill, left)
            need = candidate.remaining_prefill if full_sequence_must_fit else bound
            if need > free_kv_tokens or bound == 0:
                candidate = None  # vLLM stops admitting here; the rest goes to running
                continue
            chunk = bound
            candidate = next(waiting, None)
            candidate_key = rank(candidate) if candidate is not None else None
        else:
            view = running[index][1]
            chunk = limits.bound(view.remaining_prefill, left)
            caps[view.request_id] = chunk
            index += 1
        if chunk > 0:
            left -= chunk + limits.slot_cost
            free_kv_tokens -= chunk
    return caps
