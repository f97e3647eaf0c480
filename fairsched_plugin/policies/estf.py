"""Estimated shortest tokens first (the ordering-policies paper, Table 1): the online output-length
estimate of the request's class, minus what it has generated.

Cold start: until ``min_samples`` requests have completed every request gets the same
prior estimate, so the order is arrival order; per-class averages take over class by
class as completions arrive. Estimates change with every completion, so the snapshot the
keys read is refreshed at most every ``REFRESH_S`` seconds (waiting queues re-keyed then).
"""

from __future__ import annotations

from ..settings import ESTFConfig, FairschedConfig
from .base import OrderingPolicy, RequestView
from .output_estimate import CLASSES, Estimate, OutputLengthEstimator, prompt_class

REFRESH_S = 0.25
"""At most this often the waiting queues are re-keyed (O(n) each time)."""


class EstimatedShortestTokensFirst(OrderingPolicy):
    name = "estf"
    dynamic = True

    def __init__(self, estimator: OutputLengthEstimator) -> None:
        self.estimator = estimator
        self._snapshot: dict[str, Estimate] = {}
        self._seen_version = -1
        self._last_refresh = float("-inf")
        self.refresh(0.0, 0.0)

    @classmethod
    def from_settings(cls, section: ESTFConfig, config: FairschedConfig,
                      epoch: float) -> EstimatedShortestTokensFirst:
        return cls(OutputLengthEstimator.from_settings(section))

    def value(self, view: RequestView) -> float:
        estimate = self._snapshot[prompt_class(view.prompt_tokens)]
        return max(estimate.mean - view.output_tokens, 1.0)

    def refresh(self, now: float, kv_usage: float) -> bool:
        if self.estimator.version == self._seen_version or now - self._last_refresh < REFRESH_S:
            return False
        self._seen_version = self.estimator.version
        self._last_refresh = now
        self._snapshot = {name: self.estimator.estimate(name) for name in CLASSES}
        return True

    def observe_finished(self, view: RequestView) -> None:
        self.estimator.observe(view.prompt_tokens, view.output_tokens)

    def describe(self) -> str:
        return (f"estf(prior={self.estimator.prior.mean:g} tokens until "
                f"{self.estimator.min_samples} completions)")
