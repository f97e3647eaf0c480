"""Arrival order: vLLM's stock FCFS (``fcfs``) and the seed-002 FIFO baseline (``fifo``).

The two are the same order; ``fifo`` exists under the seed's name so that its comparison
tables read as published, and a run with both arms shows the noise between identical
schedulers.
"""

from __future__ import annotations

from .base import OrderingPolicy, RequestView


class FCFSPolicy(OrderingPolicy):
    """Arrival order across running and waiting requests.

    Decodes are left in vLLM's order: admissions follow arrival, so it already is the key
    order, and sorting would cost a request view per decode every step."""

    orders_decodes = False

    def __init__(self, name: str = "fcfs") -> None:
        self.name = name

    def value(self, view: RequestView) -> float:
        return view.arrival_time
