"""Arrival order: vLLM's stock FCFS (``fcfs``) and the ordering-policies paper's FIFO baseline
(``fifo``).

The two are the same order; ``fifo`` exists under the paper's name so that its comparison
tables read as published, and a run with both arms shows the noise between identical
schedulers.
"""

from __future__ import annotations

from .base import OrderingPolicy, RequestView


class FCFSPolicy(OrderingPolicy):
    """Arrival order across running and waiting requests: exactly vLLM's own order.

    vLLM's loop already serves its running list in admission order and admits waiting
    requests by arrival, so the adapter leaves both alone (no reorder, no plan) and this
    arm is a control: against stock vLLM it measures only the plugin's machinery. The
    chunked-prefill paper's decodes-first service is the separate ``decodes_first`` switch."""

    orders_decodes = False
    follows_vllm_order = True

    name = "fcfs"

    def value(self, view: RequestView) -> float:
        return view.arrival_time


class FIFOPolicy(FCFSPolicy):
    """The ordering-policies paper's arrival-order baseline: :class:`FCFSPolicy` under the
    paper's name."""

    name = "fifo"
