"""PREFLOW: aged weighted shortest remaining job first on attention work.

vLLM-Ascend's PREFLOW proposal (vllm-project/vllm-ascend#16360) ranks unfinished prefills by

    priority = 2 ** (age / D) / (P * R)

where ``W(n) = n (n + 1) / 2`` approximates the attention work of an ``n``-token prefix,
``P = W(prompt) - W(initial cached prefix)`` is the request's initial work and
``R = W(prompt) - W(prefill start)`` what is left of it. Work in ``W`` makes a long prompt
quadratically less urgent than a short one; the exponential age term doubles a request's
priority every ``D`` seconds, so a request that waited ``k * D`` seconds longer outranks one
with up to ``2 ** k`` times its ``P * R``: the tail is protected without a deadline.

In log space the order is that of a static key (larger priority first, so the smaller
negative log): ``log2(P * R) - age / D`` = ``log2(P) + log2(R) + (arrival - now) / D``, and
``now / D`` is shared by every request of a step, so the key ``(arrival - epoch) / D +
log2(P) + log2(R)`` never goes stale: one heap, no re-keying, like linear Aging.

The view keeps a waiting request's cached prefix but not a running prefill's initial hit,
so a running prefill counts ``P`` from the whole prompt (it ranks as if it had no hit, only
among the requests it competes with for the rest of its prefill).
"""

from __future__ import annotations

import math

from ..settings import FairschedConfig, PreflowConfig
from .base import OrderingPolicy, RequestView


def attention_work(tokens: int) -> int:
    """``W(n) = n (n + 1) / 2``: query-key pairs of causal attention over ``n`` tokens."""
    return tokens * (tokens + 1) // 2


class PreflowPolicy(OrderingPolicy):
    """Smallest ``P * R`` attention work first, with a priority that doubles every
    ``age_doubling_s`` seconds of waiting."""

    name = "preflow"
    orders_decodes = False

    def __init__(self, config: PreflowConfig, epoch: float = 0.0) -> None:
        self.age_doubling_s = config.age_doubling_s
        self.epoch = epoch

    @classmethod
    def from_settings(cls, section: PreflowConfig, config: FairschedConfig,
                      epoch: float) -> PreflowPolicy:
        return cls(section, epoch)

    def value(self, view: RequestView) -> float:
        total = attention_work(view.num_tokens)
        initial = max(total - attention_work(min(view.cached_tokens, view.num_tokens)), 1)
        remaining = max(total - attention_work(view.prefill_start), 1)
        return ((view.arrival_time - self.epoch) / self.age_doubling_s
                + math.log2(initial) + math.log2(remaining))

    def describe(self) -> str:
        return (f"preflow(priority 2^(age/{self.age_doubling_s:g} s) / (initial x remaining "
                "attention work))")
