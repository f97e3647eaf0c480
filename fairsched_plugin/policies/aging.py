"""The Aging prefill order of the chunked-prefill paper, section 3.1 (Eq. 1-4).

Priority ``P_i = alpha * (now - a_i) + beta * r_i`` with ``alpha > 0`` (priority gained per
second of waiting) and ``beta < 0`` (priority lost per remaining prefill token). Because
``alpha * now`` is shared by every request in a step, the order is that of the static key
``K_i = -alpha * a_i + beta * r_i`` (Eq. 4). We serve the largest ``K`` first; as a
min-ordered key that is ``-K = alpha * a_i - beta * r_i``. Arrival times are taken
relative to an ``epoch`` (the order does not change) so that a large alpha times a
wall-clock time does not swallow the remaining-work term in float rounding.

With the automatic alpha (``policies.auto_alpha``) the policy starts with ``alpha=None``:
plain arrival order, exactly, until the engine's prefill rate has been measured. (A large
placeholder alpha is not the same: requests a fraction of a millisecond apart would still
be ordered by prompt length.)
"""

from __future__ import annotations

from ..settings import AUTO, AgingConfig, FairschedConfig
from .base import OrderingPolicy, RequestView

DEFAULT_ALPHA = 37.5
"""Tokens of priority per second of wait, as in the paper's released code."""
DEFAULT_BETA = -1.0


class AgingPolicy(OrderingPolicy):
    """Shortest remaining prefill first, with a linear age bonus against starvation.

    Decodes are left in vLLM's (admission) order: with no prefill left their keys differ
    only by arrival, and sorting would cost a request view per decode every step."""

    name = "aging"
    orders_decodes = False

    def __init__(
        self, alpha: float | None = DEFAULT_ALPHA, beta: float = DEFAULT_BETA,
        epoch: float = 0.0, auto_factor: float | None = None,
    ) -> None:
        self.beta = beta
        self.epoch = epoch
        self.auto_factor = auto_factor
        """With ``alpha`` None: the scheduler sets alpha to this times the measured
        prefill throughput (``policies.auto_alpha``)."""
        self.alpha: float | None = None
        if alpha is not None:
            self.set_alpha(alpha)

    @classmethod
    def from_settings(cls, section: AgingConfig, config: FairschedConfig,
                      epoch: float) -> AgingPolicy:
        """An ``"auto"`` alpha starts uncalibrated (None): arrival order until measured."""
        if section.alpha == AUTO:
            return cls(alpha=None, beta=section.beta, epoch=epoch,
                       auto_factor=section.auto_factor)
        return cls(alpha=section.alpha, beta=section.beta, epoch=epoch)

    @property
    def key_follows_remaining_work(self) -> bool:  # type: ignore[override]
        """The key grows with the remaining work when beta is negative (the paper's)."""
        return self.beta <= 0

    def set_alpha(self, alpha: float) -> None:
        """Change alpha; keys taken before are stale, so the caller re-keys its queues."""
        self.alpha = alpha

    def value(self, view: RequestView) -> float:
        if self.alpha is None:
            return view.arrival_time - self.epoch
        return self.alpha * (view.arrival_time - self.epoch) - self.beta * view.remaining_prefill

    def priority(self, view: RequestView, now: float) -> float:
        """Eq. 1, the priority itself (larger first); for logs and tests, not for sorting."""
        assert self.alpha is not None, "alpha is not calibrated yet"
        return self.alpha * (now - view.arrival_time) + self.beta * view.remaining_prefill

    def overtake_delay(self, long_remaining: int, short_remaining: int) -> float:
        """Seconds after which a request with ``long_remaining`` prefill tokens outranks
        every request with ``short_remaining`` tokens that arrives later.

        From ``K_long >= K_short``: ``a_short - a_long >= -beta * (r_long - r_short) / alpha``.
        """
        assert self.alpha is not None, "alpha is not calibrated yet"
        return max(-self.beta * (long_remaining - short_remaining) / self.alpha, 0.0)

    def describe(self) -> str:
        if self.alpha is None:
            if self.auto_factor is not None:
                return (f"aging(alpha=auto: {self.auto_factor:g} x measured prefill tokens/s, "
                        f"arrival order until measured, beta={self.beta:g})")
            return f"aging(alpha uncalibrated: arrival order, beta={self.beta:g})"
        return f"aging(alpha={self.alpha:g}, beta={self.beta:g})"
