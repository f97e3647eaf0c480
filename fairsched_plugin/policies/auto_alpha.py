"""The automatic Aging alpha: a fixed fraction of the engine's measured prefill throughput.

Alpha is the priority, in prompt tokens, that one second of waiting earns. Its useful scale
is how many prompt tokens the engine prefills per second, theta: with ``alpha = theta``
a request gains, per second it waits, as much priority as the engine does prefill work in
that second, and Aging behaves like FCFS; with ``alpha << theta`` it behaves like
shortest-prompt-first. ``alpha = factor * theta`` keeps the chosen point between the two on
any engine, without hand tuning.

Theta is measured online from the engine's own steps (prefill tokens over batch time, for
steps that carry prefill work, exponentially weighted). Until ``min_steps`` such steps have
been seen, alpha is None and Aging orders by arrival, exactly: a cold engine never favours
short prompts on a guess.
"""

from __future__ import annotations


class PrefillRateEstimator:
    """Prefill tokens per second of batch time, as a ratio of exponentially weighted sums."""

    def __init__(self, min_steps: int = 32, half_life_steps: float = 200.0) -> None:
        self.min_steps = min_steps
        self._decay = 0.5 ** (1.0 / half_life_steps)
        self._tokens = 0.0
        self._seconds = 0.0
        self.steps = 0

    def observe(self, prefill_tokens: int, step_time_s: float | None) -> None:
        if prefill_tokens <= 0 or step_time_s is None or not step_time_s > 0:
            return
        self._tokens = self._tokens * self._decay + prefill_tokens
        self._seconds = self._seconds * self._decay + step_time_s
        self.steps += 1

    @property
    def rate(self) -> float | None:
        """Tokens per second, or None before ``min_steps`` prefill steps were seen."""
        if self.steps < self.min_steps or self._seconds <= 0:
            return None
        return self._tokens / self._seconds


class AutoAlpha:
    """Turns the measured rate into alpha, changing it only when it moved by ``tolerance``.

    Every change of alpha re-keys the waiting heap (O(n)), so small drifts are ignored.
    """

    def __init__(self, factor: float, estimator: PrefillRateEstimator,
                 tolerance: float = 0.2) -> None:
        self.factor = factor
        self.estimator = estimator
        self.tolerance = tolerance
        self.alpha: float | None = None

    def observe(self, prefill_tokens: int, step_time_s: float | None) -> float | None:
        """Feed one step; returns the new alpha when it should change, else None."""
        self.estimator.observe(prefill_tokens, step_time_s)
        rate = self.estimator.rate
        if rate is None:
            return None
        target = self.factor * rate
        if self.alpha is not None and abs(target - self.alpha) <= self.tolerance * self.alpha:
            return None
        self.alpha = target
        return target
