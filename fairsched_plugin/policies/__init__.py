"""Pure scheduling decisions: ordering policies and the per-step prefill plan.

Nothing here imports vLLM; the adapter turns vLLM requests into :class:`RequestView`.
"""

from __future__ import annotations

from ..config import FairschedConfig
from .aging import AgingPolicy
from .base import OrderingPolicy, RequestView, SortKey
from .fcfs import FCFSPolicy
from .plan import plan_prefill_caps

__all__ = [
    "AgingPolicy",
    "FCFSPolicy",
    "OrderingPolicy",
    "RequestView",
    "SortKey",
    "make_policy",
    "plan_prefill_caps",
]


def make_policy(config: FairschedConfig) -> OrderingPolicy:
    """The ordering policy a validated config names."""
    if config.policy == "aging":
        return AgingPolicy(alpha=config.aging.alpha, beta=config.aging.beta)
    if config.policy == "fcfs":
        return FCFSPolicy()
    raise ValueError(f"no policy named {config.policy!r}")
