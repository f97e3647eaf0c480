"""Every ordering policy the plugin can run, in one table: name -> factory -> config section.

Config validation (the ``policy`` key), :func:`make_policy`, the benchmark's arms
(``policy:key=value`` parameters are keys of the policy's section) and the README's config
table all read :data:`POLICIES`. Adding a policy is its module plus one entry here (and,
when it has parameters, its section in ``settings`` and its keys in ``config.KEYS``).

Factories take a validated :class:`~fairsched_plugin.settings.FairschedConfig`: every value
was checked once, in ``config``, so the policies' constructors do not check again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..settings import AUTO, FairschedConfig
from .af_lcb import AFLCBPolicy
from .aging import AgingPolicy
from .base import OrderingPolicy
from .estf import EstimatedShortestTokensFirst
from .fcfs import FCFSPolicy
from .guarded import GuardedAging, GuardedSRPF
from .hrrn import HRRNPolicy
from .output_estimate import OutputLengthEstimator
from .preflow import PreflowPolicy
from .static_keys import (
    AgingShortestPromptFirst,
    LongestPromptFirst,
    ShortestPromptFirst,
    ShortestRemainingTokensFirst,
    TierPolicy,
)

Factory = Callable[[FairschedConfig, float], OrderingPolicy]
"""Builds a policy from a validated config and an ``epoch`` (a wall-clock time near
start-up that keeps age terms small in float arithmetic)."""


@dataclass(frozen=True)
class PolicyEntry:
    build: Factory
    section: str | None
    """The config section holding the policy's parameters (None: it has none)."""
    summary: str
    """A phrase for the docs' config table."""


def _aging(config: FairschedConfig, epoch: float) -> OrderingPolicy:
    """Automatic alpha starts uncalibrated (None): arrival order until measured."""
    alpha = config.aging.alpha
    if alpha == AUTO:
        return AgingPolicy(alpha=None, beta=config.aging.beta, epoch=epoch,
                           auto_factor=config.aging.auto_factor)
    return AgingPolicy(alpha=alpha, beta=config.aging.beta, epoch=epoch)


def _estimator(config: FairschedConfig) -> OutputLengthEstimator:
    return OutputLengthEstimator(config.estf.prior_output_tokens, config.estf.min_samples)


POLICIES: dict[str, PolicyEntry] = {
    "fcfs": PolicyEntry(lambda config, epoch: FCFSPolicy("fcfs"), None,
                        "vLLM's own order: the control"),
    "aging": PolicyEntry(_aging, "aging", "seed 000's linear Aging"),
    "fifo": PolicyEntry(lambda config, epoch: FCFSPolicy("fifo"), None,
                        "seed 002's arrival-order baseline"),
    "tier": PolicyEntry(lambda config, epoch: TierPolicy(), None,
                        "service tier, then arrival"),
    "spf": PolicyEntry(lambda config, epoch: ShortestPromptFirst(), None,
                       "shortest prompt first"),
    "lpf": PolicyEntry(lambda config, epoch: LongestPromptFirst(), None,
                       "longest prompt first"),
    "srtf": PolicyEntry(lambda config, epoch: ShortestRemainingTokensFirst(), None,
                        "shortest remaining tokens first, an oracle"),
    "aging-spf": PolicyEntry(
        lambda config, epoch: AgingShortestPromptFirst(config.aging_spf.rate, epoch=epoch),
        "aging_spf", "shortest prompt first with an age bonus"),
    "estf": PolicyEntry(
        lambda config, epoch: EstimatedShortestTokensFirst(_estimator(config)),
        "estf", "estimated shortest tokens first"),
    "af-lcb": PolicyEntry(
        lambda config, epoch: AFLCBPolicy(config.af_lcb, _estimator(config), epoch=epoch),
        "af_lcb", "adaptive fair LCB, with estf's estimator settings"),
    "guarded-srpf": PolicyEntry(
        lambda config, epoch: GuardedSRPF(config.guarded_srpf.slack,
                                          config.guarded_srpf.window_s,
                                          config.guarded_srpf.size_allowance,
                                          config.guarded_srpf.persist_s,
                                          config.guarded_srpf.tail_window,
                                          config.guarded_srpf.overtake_running),
        "guarded_srpf", "shortest remaining prefill first, FCFS-bounded waits"),
    "guarded-aging": PolicyEntry(
        lambda config, epoch: GuardedAging(config.guarded_aging.slack,
                                           config.guarded_aging.window_s,
                                           config.guarded_aging.auto_factor, epoch=epoch,
                                           size_allowance=config.guarded_aging.size_allowance,
                                           persist_s=config.guarded_aging.persist_s),
        "guarded_aging", "Aging with the automatic alpha, FCFS-bounded waits"),
    "preflow": PolicyEntry(
        lambda config, epoch: PreflowPolicy(config.preflow.age_doubling_s, epoch=epoch),
        "preflow", "vLLM-Ascend's PREFLOW: attention work with exponential aging"),
    "hrrn": PolicyEntry(lambda config, epoch: HRRNPolicy(), None,
                        "SGLang's highest response ratio next, re-ranked every step"),
}


def make_policy(config: FairschedConfig, epoch: float = 0.0) -> OrderingPolicy:
    """The ordering policy a validated config names (its name was checked against
    :data:`POLICIES` when the config was loaded)."""
    return POLICIES[config.policy].build(config, epoch)
