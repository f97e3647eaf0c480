"""Plain request views and the ordering-policy interface.

The policy layer never sees a vLLM ``Request``: the adapter copies the few fields a
decision needs into a :class:`RequestView`, so every policy is testable with plain
values and a virtual clock.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..settings import FairschedConfig


@dataclass(slots=True)
class RequestView:
    """What a scheduling decision may know about one request: a snapshot, read only.

    Not ``frozen``: the adapter builds one per running prefill every step, and a frozen
    dataclass costs about eight times as much to construct.

    ``num_tokens`` is prompt plus generated tokens: a preempted request must recompute
    all of them, so its remaining prefill work is ``num_tokens - computed_tokens``.

    ``cached_tokens``: of a waiting request, the prompt prefix vLLM's prefix cache holds
    (it will not be computed again); its remaining work is the rest.

    ``vllm_priority`` is vLLM's ``Request.priority`` (the OpenAI request field, smaller is
    more urgent): the level of vLLM's priority scheduling, and the service tier of the
    the ordering-policies paper's policies. Not Aging's Eq. 1 priority
    (:meth:`AgingPolicy.priority`).

    ``deadline``: once the policy's :meth:`~OrderingPolicy.overdue_cutoff` reaches it, a
    policy that assigns deadlines (``OrderingPolicy.uses_deadlines``) serves the request
    before any that is not overdue; infinite for every other policy.
    """

    request_id: str
    arrival_time: float
    prompt_tokens: int
    computed_tokens: int = 0
    output_tokens: int = 0
    max_tokens: int | None = None
    vllm_priority: int = 0
    deadline: float = math.inf
    cached_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def prefill_start(self) -> int:
        """Where the next prefill chunk starts: after the computed or the cached tokens."""
        return max(self.computed_tokens, self.cached_tokens)

    @property
    def remaining_prefill(self) -> int:
        # The two properties above, inlined: the plan and the chunk rule read this
        # several times per candidate per step.
        start = max(self.computed_tokens, self.cached_tokens)
        return max(self.prompt_tokens + self.output_tokens - start, 0)

    def admission_room(self, chunk: int, full_sequence: bool) -> int:
        """KV-cache room (tokens) vLLM may need free to admit this waiting request with a
        first chunk of ``chunk`` tokens: the chunk, or the whole sequence under vLLM's
        full-sequence admission gate, plus its cached prefix. vLLM counts a cached block
        that no running request holds against the free blocks (taking it removes it from
        the free pool); whether one is held is not known here, so all count."""
        uncomputed = self.prompt_tokens + self.output_tokens - self.computed_tokens
        return uncomputed if full_sequence else min(chunk + self.cached_tokens, uncomputed)


SortKey = tuple[float, float, str]
"""A total order: policy value, then arrival time, then request id (smaller first)."""

Rank = tuple
"""What the plan sorts by at one instant: a :data:`SortKey`, or for a policy with
deadlines ``(lane, ...)`` with overdue requests in lane 0 (see ``OrderingPolicy.ranker``)."""

_OVERDUE, _ON_TIME = 0, 1
"""The two lanes of a deadline policy's rank, overdue first."""


class OrderingPolicy(ABC):
    """Decides which request is served first.

    ``key`` must not depend on the current time: the waiting queue keeps requests in a
    heap under the key they had when inserted, and running requests are re-keyed each step
    as their remaining work shrinks. A policy whose keys follow online statistics (output
    length estimates, per-tier service, KV pressure) snapshots them in :meth:`refresh`, and
    says when it did so that the adapter re-keys its waiting queues. Smaller keys are
    served first.
    """

    name: str
    tracks_service = False
    """True when the policy wants :meth:`observe_arrival` and :meth:`observe_service`."""
    dynamic = False
    """True when keys follow online state, so :meth:`refresh` must be called each step."""
    orders_decodes = True
    """Whether running decodes are sorted by key each step (they decide who gets the budget
    first and who is preempted); False where vLLM's admission order already serves."""
    follows_vllm_order = False
    """True for arrival order: vLLM's own loop already serves it, so the adapter neither
    reorders the running list nor plans caps (an exact control arm against stock vLLM)."""
    uses_deadlines = False
    """True when :meth:`deadline` gives each arriving request a point (in the unit of
    :meth:`overdue_cutoff`) after which it outranks every request that is not yet overdue
    (see :meth:`ranker`)."""
    running_first = False
    """True when a running prefill is never overtaken by a waiting request: the running
    prefills take the budget first, as vLLM's loop gives it, and the order decides which
    waiting request starts next. False: a waiting request that ranks ahead of a running
    prefill takes its budget first."""
    key_follows_remaining_work = False
    """True when a request's key (between refreshes) reads only its remaining prefill work,
    never decreasing in it, and what never changes (arrival, id). Then a request's key
    can only fall as it prefills, so a running prefill found ahead of every waiting
    request, or admitted from the head of the queue, stays ahead until the queues change,
    and the adapter need not look again every step."""

    @classmethod
    def from_settings(cls, section: Any, config: FairschedConfig,
                      epoch: float) -> OrderingPolicy:
        """The policy a validated configuration sets: built from its registry section
        (``policies.registry``; None for a policy without one), and for a policy with an
        age term, ``epoch`` (a wall-clock time near start-up that keeps age terms small in
        float arithmetic). A policy that needs more than its section overrides this."""
        return cls() if section is None else cls(section)

    @abstractmethod
    def value(self, view: RequestView) -> float:
        """The policy's own ordering value (smaller first), without tie-breaks."""

    def key(self, view: RequestView) -> SortKey:
        """The value with the documented tie-breaks: arrival time, then request id."""
        return (self.value(view), view.arrival_time, view.request_id)

    def ranker(self, now: float) -> Callable[[RequestView], Rank]:
        """The order at wall-clock time ``now``: the key itself, unless the policy assigns
        deadlines; then overdue requests come first, earliest deadline first, and the
        rest follow in key order. A request's lane changes only once (when the cutoff
        passes its deadline), so queues can keep one heap per lane instead of re-keying."""
        if not self.uses_deadlines:
            return self.key
        key = self.key
        overdue_cutoff = self.overdue_cutoff

        def rank(view: RequestView) -> Rank:
            # Read at each call: a guard may make deadlines due while a step is planned.
            if view.deadline <= overdue_cutoff(now):
                return (_OVERDUE, view.deadline, view.arrival_time, view.request_id)
            return (_ON_TIME, *key(view))

        return rank

    def rank_of_key(self, key: SortKey) -> Rank:
        """The rank (:meth:`ranker`) of a request that is not overdue, from its key alone:
        what a waiting queue stores, so its head can be compared without a view."""
        return (_ON_TIME, *key) if self.uses_deadlines else key

    admission_guard = None
    """With deadlines, what the waiting queues consult before a request passes one with an
    earlier deadline (``guarded.FcfsGuard``); None: no check, deadlines only rank."""

    def deadline(self, now: float, backlog_tokens: int, own_tokens: int,
                 request_id: str | None = None) -> float:
        """The deadline of a request arriving at ``now`` (the scheduler's clock) with
        ``backlog_tokens`` of prefill work queued ahead of it and ``own_tokens`` of its
        own (only called when ``uses_deadlines``)."""
        raise NotImplementedError(f"{self.name} assigns no deadlines")

    def forget_request(self, request_id: str, output_tokens: int = 0) -> None:
        """The request left the scheduler with ``output_tokens`` (only called when
        ``uses_deadlines``)."""

    def served_work(self, now: float) -> float:
        """Where the measure deadlines are dated in stands at ``now``: a request first
        served after this passed its deadline is late. The cutoff itself, unless a check
        can make deadlines due before they pass (the guarded policies: served work)."""
        return self.overdue_cutoff(now)

    def overdue_cutoff(self, now: float) -> float:
        """Requests whose deadline is at most this are overdue. It must never decrease.
        ``now`` for deadlines in wall-clock time; the guarded policies count served
        prefill tokens instead (``policies.guarded``)."""
        return now

    def observe_backlog(self, now: float, backlog_tokens: int, running_tokens: int = 0) -> None:
        """The prefill work queued at the start of a step, and the part of it in running
        prefills (only when ``uses_deadlines``)."""

    def observe_step(self, prefill_tokens: int, now: float = 0.0,
                     prefills_done: Sequence[str] = ()) -> None:
        """A step was scheduled at ``now`` with ``prefill_tokens`` of prefill, finishing
        the prefill of ``prefills_done`` (only when ``uses_deadlines``)."""

    def describe(self) -> str:
        """One line for the start-up log."""
        return self.name

    def refresh(self, now: float, kv_usage: float) -> bool:
        """Take a new snapshot of the online state the keys read, at the start of a step.

        Returns True when keys given before may have changed (the caller re-keys the
        waiting queues). ``kv_usage`` is the used fraction of the KV cache."""
        return False

    def observe_finished(self, view: RequestView) -> None:
        """A request finished normally with ``view.output_tokens`` generated."""

    def observe_arrival(self, view: RequestView) -> None:
        """A new request arrived (only called when ``tracks_service``)."""

    def observe_service(self, tier: int, tokens: int) -> None:
        """A request of ``tier`` (its ``vllm_priority``) got ``tokens`` in a step (only
        called when ``tracks_service``)."""
