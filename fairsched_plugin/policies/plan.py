"""The per-step prefill plan: how the residual token budget flows in policy order.

vLLM serves its running list before it admits anything from the waiting queue, so a
policy that ranks a newly arrived request above a running partial prefill must hold that
partial prefill back. The plan decides, before vLLM's own loop runs, how many tokens each
running partial prefill may take: decodes are served first, then every prefill candidate,
running and waiting alike, takes ``min(remaining, budget left)`` in policy order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator

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
    running = sorted(running_prefills, key=policy.key)
    caps = {view.request_id: 0 for view in running}
    left = max(token_budget - decode_tokens, 0)
    if not running or left == 0:
        return caps
    admissible = itertools.islice(waiting_in_order, max(free_slots, 0))
    served_running = 0
    for is_waiting, view in _merge_in_order(policy, running, admissible):
        if left == 0 or served_running == len(running):
            return caps
        chunk = min(view.remaining_prefill, left)
        if is_waiting:
            if (view.remaining_prefill if full_sequence_must_fit else chunk) > free_kv_tokens:
                break
        else:
            caps[view.request_id] = chunk
            served_running += 1
        left -= chunk
        free_kv_tokens -= chunk
    for view in running[served_running:]:
        if left == 0:
            break
        caps[view.request_id] = chunk = min(view.remaining_prefill, left)
        left -= chunk
    return caps


def _merge_in_order(
    policy: OrderingPolicy,
    running_sorted: list[RequestView],
    waiting_in_order: Iterable[RequestView],
) -> Iterator[tuple[bool, RequestView]]:
    """Both candidate streams as one, in policy order; ties go to the running request."""
    tagged_running = ((policy.key(v), 0, v) for v in running_sorted)
    tagged_waiting = ((policy.key(v), 1, v) for v in waiting_in_order)
    for _key, source, view in heapq.merge(tagged_running, tagged_waiting, key=_tag_key):
        yield source == 1, view


def _tag_key(item: tuple) -> tuple:
    return item[0], item[1]
