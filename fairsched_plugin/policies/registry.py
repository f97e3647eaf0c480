"""Every ordering policy the plugin can run, in one table: name -> (class, config section,
summary).

Config validation (the ``policy`` key), :func:`make_policy`, the benchmark's arms
(``policy:key=value`` parameters are keys of the policy's section) and the docs' config
table all read :data:`POLICIES`. Adding a policy is its module plus one row here (and,
when it has parameters, its section in ``settings``). A policy takes its section object
whole, so adding a parameter is one field in the section.

Sections come from a validated :class:`~fairsched_plugin.settings.FairschedConfig`: every
value was checked once, in ``config``, so the policies' constructors do not check again.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import FairschedConfig
from .af_lcb import AFLCBPolicy
from .aging import AgingPolicy
from .base import OrderingPolicy
from .estf import EstimatedShortestTokensFirst
from .fcfs import FCFSPolicy, FIFOPolicy
from .guarded import GuardedAging, GuardedSRPF
from .hrrn import HRRNPolicy
from .preflow import PreflowPolicy
from .static_keys import (
    AgingShortestPromptFirst,
    LongestPromptFirst,
    ShortestPromptFirst,
    ShortestRemainingTokensFirst,
    TierPolicy,
)

@dataclass(frozen=True)
class PolicyEntry:
    policy: type[OrderingPolicy]
    """Built by its ``from_settings`` from the section below."""
    section: str | None
    """The config section holding the policy's parameters (None: it has none)."""
    summary: str
    """A phrase for the docs' config table."""


POLICIES: dict[str, PolicyEntry] = {
    "fcfs": PolicyEntry(FCFSPolicy, None, "vLLM's own order: the control"),
    "aging": PolicyEntry(AgingPolicy, "aging", "the chunked-prefill paper's linear Aging"),
    "fifo": PolicyEntry(FIFOPolicy, None, "the ordering-policies paper's arrival-order baseline"),
    "tier": PolicyEntry(TierPolicy, None, "service tier, then arrival"),
    "spf": PolicyEntry(ShortestPromptFirst, None, "shortest prompt first"),
    "lpf": PolicyEntry(LongestPromptFirst, None, "longest prompt first"),
    "srtf": PolicyEntry(ShortestRemainingTokensFirst, None,
                        "shortest remaining tokens first, an oracle"),
    "aging-spf": PolicyEntry(AgingShortestPromptFirst, "aging_spf",
                             "shortest prompt first with an age bonus"),
    "estf": PolicyEntry(EstimatedShortestTokensFirst, "estf", "estimated shortest tokens first"),
    "af-lcb": PolicyEntry(AFLCBPolicy, "af_lcb",
                          "adaptive fair LCB, with estf's estimator settings"),
    "guarded-srpf": PolicyEntry(GuardedSRPF, "guarded_srpf",
                                "shortest remaining prefill first, FCFS-bounded waits"),
    "guarded-aging": PolicyEntry(GuardedAging, "guarded_aging",
                                 "Aging with the automatic alpha, FCFS-bounded waits"),
    "preflow": PolicyEntry(PreflowPolicy, "preflow",
                           "vLLM-Ascend's PREFLOW: attention work with exponential aging"),
    "hrrn": PolicyEntry(HRRNPolicy, None,
                        "SGLang's highest response ratio next, re-ranked every step"),
}


def make_policy(config: FairschedConfig, epoch: float = 0.0) -> OrderingPolicy:
    """The ordering policy a validated config names (its name was checked against
    :data:`POLICIES` when the config was loaded); ``epoch``: a wall-clock time near
    start-up that keeps age terms small in float arithmetic."""
    entry = POLICIES[config.policy]
    section = None if entry.section is None else getattr(config, entry.section)
    return entry.policy.from_settings(section, config, epoch)
