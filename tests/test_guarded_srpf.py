"""Guarded shortest remaining prefill first: deadlines from the FCFS wait, two-lane order."""

from __future__ import annotations

import math

import pytest

from fairsched_plugin.config import load_config
from fairsched_plugin.policies import GuardedSRPF, PrefillRateEstimator, RequestView, make_policy
from fairsched_plugin.policies.guarded_srpf import MIN_RATE_STEPS


def calibrated(slack: float, tokens_per_s: float = 1000.0) -> GuardedSRPF:
    policy = GuardedSRPF(slack)
    for _ in range(MIN_RATE_STEPS):
        policy.observe_step(int(tokens_per_s * 0.01), 0.01, saturated=True)
    assert policy.rate.rate == pytest.approx(tokens_per_s)
    return policy


def test_uncalibrated_deadline_is_the_arrival_so_order_is_fcfs():
    policy = GuardedSRPF(1.5)
    assert policy.deadline(100.0, backlog_tokens=5000, own_tokens=10) == 100.0
    rank = policy.ranker(now=100.5)
    early_long = RequestView("a", 100.0, 4000, deadline=policy.deadline(100.0, 0, 4000))
    late_short = RequestView("b", 100.2, 10, deadline=policy.deadline(100.2, 4000, 10))
    assert rank(early_long) < rank(late_short)


def test_only_saturated_steps_measure_the_rate():
    policy = GuardedSRPF(1.0)
    for _ in range(MIN_RATE_STEPS):
        policy.observe_step(10, 0.01, saturated=False)
    assert policy.rate.rate is None
    assert policy.deadline(5.0, 100, 10) == 5.0


def test_deadline_is_the_latest_start_within_slack_times_the_fcfs_ttft():
    policy = calibrated(slack=1.5, tokens_per_s=1000.0)
    # 2,000 tokens ahead and 500 of its own at 1,000 tokens/s: FCFS gives the first token
    # after 2.5 s; 1.5 x 2.5 s = 3.75 s, so it must start by 3.25 s.
    assert policy.deadline(10.0, backlog_tokens=2000, own_tokens=500) == pytest.approx(13.25)
    # At an idle engine a long prompt may still be overtaken for half its own prefill time.
    assert policy.deadline(10.0, backlog_tokens=0, own_tokens=2000) == pytest.approx(11.0)
    # Slack 1: the estimated FCFS start itself.
    fcfs_like = calibrated(slack=1.0, tokens_per_s=1000.0)
    assert fcfs_like.deadline(10.0, 2000, 500) == pytest.approx(12.0)
    assert fcfs_like.deadline(10.0, 0, 2000) == 10.0


def test_shortest_remaining_first_until_the_deadline_then_overdue_first():
    policy = calibrated(slack=1.0)
    long = RequestView("long", 10.0, 3000, deadline=12.0)
    short = RequestView("short", 11.0, 20, deadline=15.0)
    shorter = RequestView("shorter", 11.5, 5, deadline=16.0)
    before = sorted([long, short, shorter], key=policy.ranker(now=11.9))
    assert [v.request_id for v in before] == ["shorter", "short", "long"]
    after = sorted([long, short, shorter], key=policy.ranker(now=12.0))
    assert [v.request_id for v in after] == ["long", "shorter", "short"]
    # Overdue requests go earliest deadline first, whatever their length.
    late = sorted([long, short, shorter], key=policy.ranker(now=20.0))
    assert [v.request_id for v in late] == ["long", "short", "shorter"]


def test_remaining_work_counts_computed_tokens():
    policy = GuardedSRPF(1.0)
    almost_done = RequestView("a", 1.0, 4000, computed_tokens=3990, deadline=math.inf)
    fresh = RequestView("b", 2.0, 100, deadline=math.inf)
    assert policy.key(almost_done) < policy.key(fresh)


def test_policies_without_deadlines_rank_by_their_key():
    aging = make_policy(load_config({"fairsched": {"policy": "aging"}}, {}))
    view = RequestView("a", 1.0, 10)
    assert aging.ranker(now=5.0)(view) == aging.key(view)
    with pytest.raises(NotImplementedError):
        aging.deadline(1.0, 10, 10)


def test_shared_rate_estimator_is_used():
    estimator = PrefillRateEstimator(min_steps=1)
    policy = GuardedSRPF(2.0, estimator)
    policy.observe_step(500, 0.5, saturated=True)
    # 1,000 tokens/s: start by 2 x (1 s + 0.1 s) - 0.1 s.
    assert policy.deadline(0.0, 1000, 100) == pytest.approx(2.1)


def test_slack_below_one_is_refused():
    from fairsched_plugin.config import ConfigError

    with pytest.raises(ConfigError, match="guarded_srpf.slack"):
        load_config({"fairsched": {"guarded_srpf": {"slack": 0.9}}}, {})
