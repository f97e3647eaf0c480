"""Pure scheduling decisions: ordering policies and the per-step prefill plan.

Nothing here imports vLLM; the adapter turns vLLM requests into :class:`RequestView`.
"""

from __future__ import annotations

from ..config import AUTO, FairschedConfig
from .aging import AgingPolicy
from .auto_alpha import UNCALIBRATED_ALPHA, AutoAlpha, PrefillRateEstimator
from .base import OrderingPolicy, RequestView, SortKey
from .fcfs import FCFSPolicy
from .plan import plan_prefill_caps

__all__ = [
    "AgingPolicy",
    "AutoAlpha",
    "PrefillRateEstimator",
    "FCFSPolicy",
    "OrderingPolicy",
    "RequestView",
    "SortKey",
    "make_policy",
    "plan_prefill_caps",
]


def make_policy(config: FairschedConfig, epoch: float = 0.0) -> OrderingPolicy:
    """The ordering policy a validated config names (automatic alpha starts uncalibrated)."""
    if config.policy == "aging":
        alpha = config.aging.alpha
        return AgingPolicy(
            alpha=UNCALIBRATED_ALPHA if alpha == AUTO else alpha,
            beta=config.aging.beta,
            epoch=epoch,
        )
    if config.policy == "fcfs":
        return FCFSPolicy()
    raise ValueError(f"no policy named {config.policy!r}")
