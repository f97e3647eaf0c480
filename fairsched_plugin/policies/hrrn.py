"""Highest response ratio next, as SGLang merged it (sgl-project/sglang#32911).

A request's response ratio is ``(wait + s) / s``, where ``s`` is its estimated prefill time:
its uncached input over the engine's prefill rate. The largest ratio is served first, so a
short prompt goes ahead of a long one until the long one has waited proportionally longer:
a request of ``s`` seconds of work that waited ``w`` outranks every request whose wait is a
smaller multiple of its own work.

With one prefill rate for every request, ``ratio = 1 + wait * rate / remaining``, whose order
is that of ``wait / remaining`` alone: the rate cancels and is not needed. The order does
change with time (a long prompt's ratio grows slower than a short one's), so the keys are a
snapshot taken at the start of every step (``dynamic``): each step re-keys the waiting queue,
O(n) for n waiting requests. That cost is the price of the key
(``benchmarks/overhead_harness.py rekey`` measures it); Aging and PREFLOW have static keys
and no such cost.
"""

from __future__ import annotations

from .base import OrderingPolicy, RequestView


class HRRNPolicy(OrderingPolicy):
    """Largest ``wait / remaining prefill`` first, re-ranked every step."""

    name = "hrrn"
    orders_decodes = False
    dynamic = True

    def __init__(self) -> None:
        self._now = 0.0

    def refresh(self, now: float, kv_usage: float) -> bool:
        self._now = now
        return True

    def value(self, view: RequestView) -> float:
        wait = max(self._now - view.arrival_time, 0.0)
        return -wait / max(view.remaining_prefill, 1)

    def describe(self) -> str:
        return "hrrn(largest (wait + prefill time) / prefill time first, re-ranked every step)"
