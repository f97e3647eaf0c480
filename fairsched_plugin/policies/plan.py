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

from .base import OrderingPolicy, RequestView


def plan_prefill_caps(
    policy: OrderingPolicy,
    running_prefills: Iterable[RequestView],
    waiting_in_order: Iterable[RequestView],
    decode_tokens: int,
    token_budget: int,
    free_slots: int,
    free_kv_tokens: int,
    full_sequence_must_fit: bool = True,
) -> dict[str, int]:
    """Token caps for the prefill candidates the residual budget reaches.

    Args:
        policy: the ordering; ``waiting_in_order`` must already follow its key.
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

    Returns:
        ``{request_id: cap}`` for every running prefill; 0 means "not this step". Waiting
        requests get no cap: vLLM admits them in queue order after the running loop, so
        whatever the plan kept free reaches them, and any budget a planned step could not
        use (a failed allocation, a prefix-cache hit) still goes to work.
    """
    running = sorted((policy.key(view), view) for view in running_prefills)
    caps = {view.request_id: 0 for _key, view in running}
    left = max(token_budget - decode_tokens, 0)
    if not running or left == 0:
        return caps
    # A two-way merge of the two streams in policy order; ties go to the running request.
    waiting = itertools.islice(waiting_in_order, max(free_slots, 0))
    candidate = next(waiting, None)
    candidate_key = policy.key(candidate) if candidate is not None else None
    index = 0
    while index < len(running) and left > 0:
        running_key, view = running[index]
        if candidate is not None and candidate_key < running_key:
            chunk = min(candidate.remaining_prefill, left)
            need = candidate.remaining_prefill if full_sequence_must_fit else chunk
            if need > free_kv_tokens:
                candidate = None  # vLLM stops admitting here; the rest goes to running
                continue
            candidate = next(waiting, None)
            candidate_key = policy.key(candidate) if candidate is not None else None
        else:
            chunk = min(view.remaining_prefill, left)
            caps[view.request_id] = chunk
            index += 1
        left -= chunk
        free_kv_tokens -= chunk
    return caps
