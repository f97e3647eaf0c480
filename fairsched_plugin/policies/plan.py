"""One step's prefill decision, in the order it is made (the chunked-prefill paper's §3.2.2-3.3:
Algorithm 1, Eq. 12-14).

The adapter gathers what vLLM knows (the running partial prefills' and the admissible
waiting requests' views, the decodes, free slots, KV room), starts the chunk rule's step
with the decodes (``LatencyChunkRule.begin_step``, which also sets APC's cap, Eq. 12)
and calls :func:`plan_prefill_caps`; what comes back is one token cap per request, which
the adapter's per-request hook applies inside vLLM's own loop. This is phase 4 of the
scheduler's step (``adapter.scheduler``); in it, for every prefill candidate:

4.1 **Order.** Running partial prefills and waiting requests are merged in the policy's
   order at ``now`` (:func:`step_rank`; the keys, e.g. Aging's, are in ``aging.py`` and
   its siblings), decodes having taken their tokens first. Under a policy whose running
   prefills come first (``OrderingPolicy.running_first``), all of them precede every
   waiting request, as in vLLM's own loop.
4.2 **Bound.** ``candidate_walk.CandidateWalk`` meets the candidates in that order, each
   with its bound ``h = min(remaining, budget left)`` (Algorithm 1, line 4) under vLLM's
   own per-request limits (``candidate_walk.ChunkLimits``), and follows vLLM's admission
   rules (free KV room, a waiting request that gets 0 ends admissions).
4.3 **Chunk.** Without LPRS, the bound (vLLM's token-budget rule). With LPRS, Algorithm 1:
   the candidate chunks ``{1, h} ∪ {kΔ ≤ h}``, a predicted batch time for each from a
   ``chunk_rule.BatchLatencyModel``, the one closest to the target
   (``lprs.select_chunk``).
4.4 **Alignment.** When on, a chunk that does not finish its prompt is cut back to end on
   a KV block boundary (``alignment.align_chunk``).
4.5 **APC.** When on, Eq. 14 accepts the chunk, warm-starts a prefill, or holds it back
   (``apc.ActivePrefillControl``, with the step's cap from Eq. 12).
4.6 **Cap.** The chunk is the candidate's cap; the walk moves on with the budget and KV
   room it leaves.

Phases 4.3-4.5 are ``chunk_rule.LatencyChunkRule``, one per scheduler, built when LPRS,
APC or alignment is on. Without it, 4.3-4.5 are the bound alone, and :func:`plan_prefill_caps`
takes a shorter road to the same caps (a two-way merge that stops at the last running
prefill; waiting requests get no cap then, vLLM admits them in queue order).

Here: the order (4.1), the caps (4.6) and that shorter road; 4.2 is ``candidate_walk``,
4.3-4.5 ``chunk_rule``. Nothing in the three imports vLLM or ONNX
Runtime.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from .base import OrderingPolicy, Rank, RequestView
from .candidate_walk import CandidateWalk, ChunkLimits
from .chunk_rule import ChunkRule


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
            left to free blocks, never progress. A waiting request's need counts its
            cached prefix too (``RequestView.admission_room``).
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
    if policy.running_first:
        running = [((RUNNING_FIRST, key), view) for key, view in running]
        ranked = rank
        rank = lambda view: (WAITING_AFTER, ranked(view))  # noqa: E731
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
            need = candidate.admission_room(bound, full_sequence_must_fit)
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


RUNNING_FIRST, WAITING_AFTER = 0, 1
"""Under a policy whose running prefills come first: the lanes of running and waiting."""


def step_rank(policy: OrderingPolicy, now: float,
              by_priority: bool = False) -> Callable[[RequestView], Rank]:
    """The order of one step: the policy's at ``now``, under vLLM's priority scheduling
    within the request's priority (smaller first, as vLLM orders it)."""
    rank = policy.ranker(now)
    if not by_priority:
        return rank
    return lambda view: (view.vllm_priority, rank(view))
