"""Ranked service, the ordering-policies paper's semantics: each step serves at most
``max_batch_size`` active requests in policy order; the rest keep their KV cache and wait.

"Active" is every request the engine has accepted, running or waiting. The top
``max_batch_size`` by key are served: the running ones among them stay visible to vLLM's
loop, the others are hidden for the step, and the waiting ones among them are the only
admissions allowed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from .base import OrderingPolicy, RequestView


@dataclass(frozen=True)
class RankedStep:
    served_running: set[str]
    """Ids of running requests in the top ``max_batch_size``."""
    admissions: int
    """How many waiting requests are in the top, so may be admitted this step."""


def ranked_service(
    policy: OrderingPolicy,
    running: Iterable[RequestView],
    waiting_in_order: Iterable[RequestView],
    max_batch_size: int,
) -> RankedStep:
    """Merge running (any order) and waiting (best first, consumed lazily) by key and
    take the first ``max_batch_size``: O(r log r + k)."""
    key = policy.key
    best_running = heapq.nsmallest(max_batch_size, running, key=key)
    served: set[str] = set()
    admissions = 0
    waiting = iter(waiting_in_order)
    next_waiting = next(waiting, None)
    for view in best_running:
        while (
            next_waiting is not None
            and len(served) + admissions < max_batch_size
            and key(next_waiting) < key(view)
        ):
            admissions += 1
            next_waiting = next(waiting, None)
        if len(served) + admissions >= max_batch_size:
            break
        served.add(view.request_id)
    free = max_batch_size - len(served) - admissions
    admissions += sum(1 for _ in itertools.islice(itertools.chain(
        () if next_waiting is None else (next_waiting,), waiting), free))
    return RankedStep(served, admissions)
