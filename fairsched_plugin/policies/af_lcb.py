"""Adaptive fair LCB (the ordering-policies paper, Table 1): estimated remaining work, optimistic by
its uncertainty, with an age bonus, a service-tier deficit and KV-cache pressure.

For a request of prompt class ``c`` and tier ``t`` (smaller value first)::

    lcb      = max(mean_c - z * std_c / sqrt(n_c), 1)        output tokens, optimistic
    rem_out  = max(lcb - generated, 1)
    work     = prompt_weight * remaining_prefill + rem_out
    pressure = clip((kv_usage - kv_threshold) / (1 - kv_threshold), 0, 1)
    value    = work
             + age_rate * (arrival - epoch)                   age bonus (static form)
             - tier_weight * deficit_t                        tier owed service
             + kv_weight * pressure * (num_tokens + rem_out)  KV footprint under pressure

``mean_c, std_c, n_c`` come from :class:`OutputLengthEstimator` (per class, global, then
prior). ``deficit_t = entitled_t - served_t``: shares in [0, 1] of exponentially decayed
token counters (half-life ``tier_half_life_s``); a tier is entitled to service in
proportion to its decayed demand (prompt plus estimated output of its arrivals) weighted
by ``2 ** -t``. Every term but the age bonus is bounded, so a request that has waited
:meth:`AFLCBPolicy.overtake_bound` seconds longer than another outranks it: nothing starves.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..settings import AFLCBConfig, FairschedConfig
from .base import OrderingPolicy, RequestView
from .output_estimate import CLASSES, Estimate, OutputLengthEstimator, prompt_class

REFRESH_S = 0.25
"""At most this often the online state is snapshotted and the waiting queues re-keyed."""


class TierLedger:
    """Decayed per-tier demand and service, and each tier's deficit of service."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.demand: dict[int, float] = defaultdict(float)
        self.served: dict[int, float] = defaultdict(float)
        self._pending_demand: dict[int, float] = defaultdict(float)
        self._pending_served: dict[int, float] = defaultdict(float)
        self._last: float | None = None

    def add_demand(self, tier: int, tokens: float) -> None:
        self._pending_demand[tier] += tokens

    def add_service(self, tier: int, tokens: float) -> None:
        self._pending_served[tier] += tokens

    @property
    def has_pending(self) -> bool:
        return bool(self._pending_demand or self._pending_served)

    def advance(self, now: float) -> None:
        """Decay the counters to ``now`` and fold in what arrived since the last call."""
        factor = 1.0 if self._last is None else 0.5 ** (max(now - self._last, 0.0) / self.half_life_s)
        self._last = now
        for counters, pending in ((self.demand, self._pending_demand),
                                  (self.served, self._pending_served)):
            for tier in set(counters) | set(pending):
                counters[tier] = counters[tier] * factor + pending.get(tier, 0.0)
            pending.clear()

    def deficits(self) -> dict[int, float]:
        """Entitled share minus served share per tier, each in [-1, 1]."""
        weighted = {t: d * 2.0 ** -t for t, d in self.demand.items()}
        total_weight = sum(weighted.values())
        total_served = sum(self.served.values())
        if total_weight <= 0:
            return {}
        return {
            t: weighted[t] / total_weight
            - (self.served.get(t, 0.0) / total_served if total_served > 0 else 0.0)
            for t in weighted
        }


class AFLCBPolicy(OrderingPolicy):
    name = "af-lcb"
    dynamic = True
    tracks_service = True

    def __init__(
        self, config: AFLCBConfig, estimator: OutputLengthEstimator, epoch: float = 0.0
    ) -> None:
        self.config = config
        self.estimator = estimator
        self.epoch = epoch
        self.ledger = TierLedger(config.tier_half_life_s)
        self._lcb: dict[str, float] = {}
        self._deficit: dict[int, float] = {}
        self._pressure = 0.0
        self._seen_version = -1
        self._last_refresh = float("-inf")
        self._snapshot_lcb()

    @classmethod
    def from_settings(cls, section: AFLCBConfig, config: FairschedConfig,
                      epoch: float) -> AFLCBPolicy:
        """With ``estf``'s estimator settings."""
        return cls(section, OutputLengthEstimator.from_settings(config.estf), epoch)

    def lcb(self, estimate: Estimate) -> float:
        """The optimistic output length: mean less ``z`` standard errors, at least 1."""
        spread = self.config.z * estimate.std / math.sqrt(max(estimate.n, 1))
        return max(estimate.mean - spread, 1.0)

    def value(self, view: RequestView) -> float:
        c = self.config
        rem_out = max(self._lcb[prompt_class(view.prompt_tokens)] - view.output_tokens, 1.0)
        value = c.prompt_weight * view.remaining_prefill + rem_out
        value += c.age_rate * (view.arrival_time - self.epoch)
        value -= c.tier_weight * self._deficit.get(view.vllm_priority, 0.0)
        if self._pressure > 0:
            value += c.kv_weight * self._pressure * (view.num_tokens + rem_out)
        return value

    def overtake_bound(self, view: RequestView) -> float:
        """Seconds after which ``view`` (if it makes no progress) outranks every request
        that arrives later: its work, the widest tier swing and its worst KV term,
        divided by the age rate."""
        c = self.config
        lcb_max = max(self._lcb.values())
        work = c.prompt_weight * view.remaining_prefill + lcb_max
        kv = c.kv_weight * (view.num_tokens + lcb_max)
        return (work + 2 * c.tier_weight + kv) / c.age_rate

    def refresh(self, now: float, kv_usage: float) -> bool:
        if now - self._last_refresh < REFRESH_S:
            return False
        c = self.config
        pressure = min(max((kv_usage - c.kv_threshold) / (1 - c.kv_threshold), 0.0), 1.0)
        changed = (
            self.estimator.version != self._seen_version
            or self.ledger.has_pending
            or pressure != self._pressure
        )
        if not changed:
            return False
        self._last_refresh = now
        self._pressure = pressure
        self.ledger.advance(now)
        self._deficit = self.ledger.deficits()
        self._snapshot_lcb()
        return True

    def _snapshot_lcb(self) -> None:
        self._seen_version = self.estimator.version
        self._lcb = {name: self.lcb(self.estimator.estimate(name)) for name in CLASSES}

    def observe_finished(self, view: RequestView) -> None:
        self.estimator.observe(view.prompt_tokens, view.output_tokens)

    def observe_arrival(self, view: RequestView) -> None:
        expected = self.estimator.estimate(prompt_class(view.prompt_tokens)).mean
        self.ledger.add_demand(view.vllm_priority, view.prompt_tokens + expected)

    def observe_service(self, tier: int, tokens: int) -> None:
        self.ledger.add_service(tier, tokens)

    def describe(self) -> str:
        c = self.config
        return (f"af-lcb(z={c.z:g}, prompt_weight={c.prompt_weight:g}, "
                f"age_rate={c.age_rate:g}/s, tier_weight={c.tier_weight:g}, "
                f"kv_threshold={c.kv_threshold:g}, kv_weight={c.kv_weight:g})")
