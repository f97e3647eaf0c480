"""First come, first served: vLLM's stock order, expressed as a policy key."""

from __future__ import annotations

from .base import OrderingPolicy, RequestView


class FCFSPolicy(OrderingPolicy):
    """Arrival order across running and waiting prefills."""

    name = "fcfs"

    def value(self, view: RequestView) -> float:
        return view.arrival_time
