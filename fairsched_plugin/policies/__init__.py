"""Pure scheduling decisions: ordering policies and the per-step prefill plan.

Nothing here imports vLLM; the adapter turns vLLM requests into :class:`RequestView`.
"""

from __future__ import annotations

from .af_lcb import AFLCBPolicy
from .aging import AgingPolicy
from .auto_alpha import AutoAlpha, PrefillRateEstimator
from .base import OrderingPolicy, Rank, RequestView, SortKey
from .estf import EstimatedShortestTokensFirst
from .fcfs import FCFSPolicy
from .guarded import GuardedAging, GuardedSRPF
from .output_estimate import OutputLengthEstimator
from .plan import plan_prefill_caps
from .ranked import ranked_service
from .registry import POLICIES, PolicyEntry, make_policy
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
    "POLICIES",
    "PolicyEntry",
    "ShortestPromptFirst",
    "ShortestRemainingTokensFirst",
    "TierPolicy",
    "ranked_service",
    "AutoAlpha",
    "PrefillRateEstimator",
    "FCFSPolicy",
    "GuardedAging",
    "GuardedSRPF",
    "OrderingPolicy",
    "Rank",
    "RequestView",
    "SortKey",
    "make_policy",
    "plan_prefill_caps",
]

