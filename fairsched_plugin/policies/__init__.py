"""Pure scheduling decisions: ordering policies and the per-step prefill plan.

Nothing here imports vLLM; the adapter turns vLLM requests into :class:`RequestView`.
"""

from __future__ import annotations

from ..config import AUTO, FairschedConfig
from .af_lcb import AFLCBPolicy
from .aging import AgingPolicy
from .auto_alpha import AutoAlpha, PrefillRateEstimator
from .base import OrderingPolicy, Rank, RequestView, SortKey
from .estf import EstimatedShortestTokensFirst
from .fcfs import FCFSPolicy
from .guarded_srpf import GuardedSRPF
from .output_estimate import OutputLengthEstimator
from .plan import plan_prefill_caps
from .ranked import ranked_service
from .static_keys import (
    AgingShortestPromptFirst,
    LongestPromptFirst,
    ShortestPromptFirst,
    ShortestRemainingTokensFirst,
    TierPolicy,
)

__all__ = [
    "AFLCBPolicy",
    "AgingPolicy",
    "AgingShortestPromptFirst",
    "EstimatedShortestTokensFirst",
    "LongestPromptFirst",
    "OutputLengthEstimator",
    "ShortestPromptFirst",
    "ShortestRemainingTokensFirst",
    "TierPolicy",
    "ranked_service",
    "AutoAlpha",
    "PrefillRateEstimator",
    "FCFSPolicy",
    "GuardedSRPF",
    "OrderingPolicy",
    "Rank",
    "RequestView",
    "SortKey",
    "make_policy",
    "plan_prefill_caps",
]


def make_policy(config: FairschedConfig, epoch: float = 0.0) -> OrderingPolicy:
    """The ordering policy a validated config names (automatic alpha starts uncalibrated).

    ``epoch`` (a wall-clock time near start-up) keeps age terms small in float arithmetic.
    """
    name = config.policy
    if name == "aging":
        alpha = config.aging.alpha
        return AgingPolicy(
            alpha=None if alpha == AUTO else alpha,
            beta=config.aging.beta,
            epoch=epoch,
        )
    if name in ("fcfs", "fifo"):
        return FCFSPolicy(name)
    if name == "guarded-srpf":
        return GuardedSRPF(config.guarded_srpf.slack, config.guarded_srpf.window_s)
    if name == "aging-spf":
        return AgingShortestPromptFirst(config.aging_spf.rate, epoch=epoch)
    if name in ("estf", "af-lcb"):
        estimator = OutputLengthEstimator(
            config.estf.prior_output_tokens, config.estf.min_samples
        )
        if name == "estf":
            return EstimatedShortestTokensFirst(estimator)
        return AFLCBPolicy(config.af_lcb, estimator, epoch=epoch)
    static = {
        "tier": TierPolicy,
        "spf": ShortestPromptFirst,
        "lpf": LongestPromptFirst,
        "srtf": ShortestRemainingTokensFirst,
    }
    if name in static:
        return static[name]()
    raise ValueError(f"no policy named {name!r}")
