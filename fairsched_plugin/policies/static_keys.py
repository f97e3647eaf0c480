"""The ordering-policies paper's orderings whose key is fixed by request metadata (the
ordering-policies paper, Table 1).

Tier, shortest and longest prompt first, the oracle shortest remaining tokens first and
aging shortest-prompt-first: each a one-line value, ties broken by arrival then id.
"""

from __future__ import annotations

import math

from ..settings import AgingSPFConfig, FairschedConfig
from .base import OrderingPolicy, RequestView


class TierPolicy(OrderingPolicy):
    """Service tier, then arrival: the OpenAI ``priority`` field, lower is more urgent
    (vLLM's convention)."""

    name = "tier"

    def value(self, view: RequestView) -> float:
        return view.vllm_priority


class ShortestPromptFirst(OrderingPolicy):
    """Visible prompt length, shortest first."""

    name = "spf"

    def value(self, view: RequestView) -> float:
        return view.prompt_tokens


class LongestPromptFirst(OrderingPolicy):
    """Negative prompt length: longest first."""

    name = "lpf"

    def value(self, view: RequestView) -> float:
        return -view.prompt_tokens


class ShortestRemainingTokensFirst(OrderingPolicy):
    """Oracle: the request's ``max_tokens`` minus the tokens generated so far.

    This is an oracle only because the benchmark sets ``max_tokens`` to the true output
    length (with ``ignore_eos``); for real traffic ``max_tokens`` is a cap, not the length.
    A request without ``max_tokens`` ranks last.
    """

    name = "srtf"

    def value(self, view: RequestView) -> float:
        if view.max_tokens is None:
            return math.inf
        return max(view.max_tokens - view.output_tokens, 0)


class AgingShortestPromptFirst(OrderingPolicy):
    """Prompt length minus ``rate`` tokens per second waited.

    ``prompt - rate * (now - arrival)`` orders like ``prompt + rate * arrival`` because
    ``rate * now`` is common to every request; arrivals are taken from ``epoch`` so that
    the product stays small. A request that waited ``(p_long - p_short) / rate`` seconds
    longer outranks any shorter one.
    """

    name = "aging-spf"

    def __init__(self, config: AgingSPFConfig, epoch: float = 0.0) -> None:
        self.rate = config.rate
        self.epoch = epoch

    @classmethod
    def from_settings(cls, section: AgingSPFConfig, config: FairschedConfig,
                      epoch: float) -> AgingShortestPromptFirst:
        return cls(section, epoch)

    def value(self, view: RequestView) -> float:
        return view.prompt_tokens + self.rate * (view.arrival_time - self.epoch)

    def describe(self) -> str:
        return f"aging-spf(rate={self.rate:g} tokens/s)"
