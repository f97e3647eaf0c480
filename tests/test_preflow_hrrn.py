"""PREFLOW and HRRN, the two published keys among the default's candidates."""

from __future__ import annotations

import math

import pytest

from fairsched_plugin.settings import PreflowConfig
from fairsched_plugin.config import from_values
from fairsched_plugin.policies import RequestView, make_policy
from fairsched_plugin.policies.hrrn import HRRNPolicy
from fairsched_plugin.policies.preflow import PreflowPolicy, attention_work


def _priority(view: RequestView, now: float, d: float) -> float:
    """PREFLOW's priority as the proposal writes it (larger first)."""
    total = attention_work(view.num_tokens)
    initial = total - attention_work(view.cached_tokens)
    remaining = total - attention_work(view.prefill_start)
    return 2 ** ((now - view.arrival_time) / d) / (initial * remaining)


def test_attention_work_is_triangular():
    assert [attention_work(n) for n in (0, 1, 2, 10)] == [0, 1, 3, 55]


@pytest.mark.parametrize("now", [5.0, 7.5, 40.0])
def test_preflow_static_key_orders_as_the_priority_at_any_time(now):
    policy = PreflowPolicy(PreflowConfig(age_doubling_s=2.0))
    views = [RequestView("old-long", 0.0, 800), RequestView("new-short", 4.0, 60),
             RequestView("cached", 3.0, 900, cached_tokens=850),
             RequestView("half-done", 1.0, 400, computed_tokens=200)]
    by_key = sorted(views, key=policy.key)
    by_priority = sorted(views, key=lambda v: -_priority(v, now, 2.0))
    assert [v.request_id for v in by_key] == [v.request_id for v in by_priority]


def test_preflow_priority_doubles_every_d_seconds():
    policy = PreflowPolicy(PreflowConfig(age_doubling_s=0.5))
    a = RequestView("a", 0.0, 100)
    b = RequestView("b", 0.5, 100)
    assert policy.value(b) - policy.value(a) == pytest.approx(1.0)


def test_preflow_a_long_prompt_overtakes_after_enough_doublings():
    policy = PreflowPolicy(PreflowConfig(age_doubling_s=1.0))
    long = RequestView("long", 0.0, 1000)
    # (P*R) ratio of a 1,000- to a 100-token prompt: (W(1000)/W(100))^2, about 9,800x.
    doublings = 2 * math.log2(attention_work(1000) / attention_work(100))
    just_before = RequestView("short", doublings - 0.01, 100)
    just_after = RequestView("short", doublings + 0.01, 100)
    assert policy.key(just_before) < policy.key(long) < policy.key(just_after)


def test_hrrn_largest_wait_over_work_first_and_it_changes_with_time():
    policy = HRRNPolicy()
    long = RequestView("long", 0.0, 1000)
    short = RequestView("short", 9.0, 10)
    policy.refresh(now=10.0, kv_usage=0.0)  # ratios 1 + 10/1000 against 1 + 1/10
    assert policy.key(short) < policy.key(long)
    policy.refresh(now=9.05, kv_usage=0.0)  # short has waited 0.05 s: 0.005 < 0.00905
    assert policy.key(long) < policy.key(short)


def test_hrrn_asks_for_a_rekey_every_step():
    policy = HRRNPolicy()
    assert policy.dynamic and policy.refresh(now=1.0, kv_usage=0.0)


def test_registry_builds_both():
    assert isinstance(make_policy(from_values({"policy": "preflow",
                                               "preflow": {"age_doubling_s": 0.25}})),
                      PreflowPolicy)
    assert isinstance(make_policy(from_values({"policy": "hrrn"})), HRRNPolicy)
