"""Online output-length statistics from completed requests, per prompt class and overall.

ESTF and AF-LCB know nothing of a request's output length in advance; they learn the
average (and spread) of completed requests' output lengths, per prompt-length class
(short < 128 <= medium <= 1024 < long, the paper's classes) and over all classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..settings import ESTFConfig

SHORT_BELOW = 128
"""Prompts with fewer tokens are ``short`` (the ordering-policies paper, section 5.1)."""
LONG_ABOVE = 1024
"""Prompts with more tokens are ``long``; the rest are ``medium``."""
CLASSES = ("short", "medium", "long")


def prompt_class(prompt_tokens: int) -> str:
    """The paper's request class from the visible prompt length: ``short`` (< 128 tokens),
    ``medium`` (128..1024) or ``long`` (> 1024). The workload builder uses it too."""
    if prompt_tokens < SHORT_BELOW:
        return "short"
    if prompt_tokens > LONG_ABOVE:
        return "long"
    return "medium"


@dataclass(slots=True)
class RunningStats:
    """Welford's running mean and variance: O(1) per observation, numerically stable."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    std: float
    n: int


class OutputLengthEstimator:
    """Per-class estimate once a class has ``min_samples`` completions, else the global
    one once that has, else the configured prior (cold start: every request alike)."""

    def __init__(self, prior_output_tokens: float, min_samples: int) -> None:
        self.prior = Estimate(prior_output_tokens, 0.0, 0)
        self.min_samples = min_samples
        self.overall = RunningStats()
        self.by_class: dict[str, RunningStats] = {}
        self.version = 0
        """Bumped by every observation, so a policy knows its snapshot is stale."""

    @classmethod
    def from_settings(cls, config: ESTFConfig) -> OutputLengthEstimator:
        return cls(config.prior_output_tokens, config.min_samples)

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        self.overall.add(output_tokens)
        self.by_class.setdefault(prompt_class(prompt_tokens), RunningStats()).add(output_tokens)
        self.version += 1

    def estimate(self, request_class: str) -> Estimate:
        """The estimate for a class (see :func:`prompt_class`)."""
        stats = self.by_class.get(request_class)
        for candidate in (stats, self.overall):
            if candidate is not None and candidate.n >= self.min_samples:
                return Estimate(candidate.mean, candidate.std, candidate.n)
        return self.prior
