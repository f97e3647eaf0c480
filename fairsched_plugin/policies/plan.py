"""The per-step prefill plan: how the residual token budget flows in policy order.

vLLM serves its running list before it admits anything from the waiting queue, so a
policy that ranks a newly arrived request above a running partial prefill must hold that
partial prefill back. The plan decides, before vLLM's own loop runs, how many tokens each
running partial prefill may take: decodes are served first, then every prefill candidate,
running and waiting alike, takes ``min(remaining, budget left)`` in policy order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Protocol

from .base import OrderingPolicy, RequestView


class ChunkRule(Protocol):
    """Decides a prefill candidate's chunk inside the plan (LPRS, APC, alignment)."""

    def choose(self, view: RequestView, bound: int) -> int:
        """The chunk for ``view``, at most ``bound`` (the feasible ``h``); 0 skips it."""


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
) -> dict[str, int]:
    """Token caps for the prefill candidates the residual budget reaches.

    Args:
        policy: the ordering; ``waiting_in_order`` must already follow its order at
            ``now`` (``policy.ranker(now)``).
        running_prefills: running requests with prefill work left (any order).
        waiting_in_order: waiting requests, best first; consumed lazily and only as far
            as needed, so a long queue costs nothing beyond the requests that get budget.
        decode_tokens: tokens the decodes of this step take before any prefill.
        token_budget: the step's hard budget (``max_num_scheduled_tokens``).
        free_slots: how many waiting requests may still be admitted (running slots).
        free_kv_tokens: KV-cache room for new tokens. vLLM stops admitting at the first
            waiting request whose blocks cannot be allocated, so from there on the plan
            gives the budget to running prefills only; otherwise a running prefill could
            be held back for a waiting request that never gets in, and with no decodes
            left to free blocks, never progress.
        full_sequence_must_fit: vLLM's ``scheduler_reserve_full_isl``: a waiting request is
            admitted only if its whole prompt fits, not just its first chunk.
        rule: without one, each candidate takes ``min(remaining, budget left)`` (vLLM's
            token-budget rule). With one, the rule picks every chunk, waiting requests'
            included, and the plan is exclusive: the caller admits no waiting request
            the plan did not cap, and the first waiting candidate that gets 0 ends
            admissions for the step, as vLLM's waiting loop stops at a request it
            cannot schedule.
        now: the wall-clock time the order is taken at (it matters only to a policy with
            deadlines).

    Returns:
        ``{request_id: cap}`` for every running prefill (0 means "not this step") and,
        with a rule, for the waiting requests to admit. Without a rule, waiting requests
        get no cap: vLLM admits them in queue order after the running loop, so whatever
        the plan kept free reaches them, and any budget a planned step could not use (a
        failed allocation, a prefix-cache hit) still goes to work.
    """
    rank = policy.ranker(now)
    running = sorted((rank(view), view) for view in running_prefills)
    caps = {view.request_id: 0 for _key, view in running}
    left = max(token_budget - decode_tokens, 0)
    if left == 0 or (rule is None and not running):
        return caps
    # A two-way merge of the two streams in policy order; ties go to the running request.
    waiting = itertools.islice(waiting_in_order, max(free_slots, 0))
    candidate = next(waiting, None)
    candidate_key = rank(candidate) if candidate is not None else None
    index = 0
    while left > 0 and (index < len(running) or (rule is not None and candidate is not None)):
        if candidate is not None and (index == len(running) or candidate_key < running[index][0]):
            bound = min(candidate.remaining_prefill, left)
            need = candidate.remaining_prefill if full_sequence_must_fit else bound
            if need > free_kv_tokens:
                candidate = None  # vLLM stops admitting here; the rest goes to running
                continue
            chunk = bound if rule is None else rule.choose(candidate, bound)
            if chunk == 0:
                candidate = None
                continue
            if rule is not None:
                caps[candidate.request_id] = chunk
            candidate = next(waiting, None)
            candidate_key = rank(candidate) if candidate is not None else None
        else:
            view = running[index][1]
            bound = min(view.remaining_prefill, left)
            chunk = bound if rule is None else rule.choose(view, bound)
            caps[view.request_id] = chunk
            index += 1
        left -= chunk
        free_kv_tokens -= chunk
    return caps
