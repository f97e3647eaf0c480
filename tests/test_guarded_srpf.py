"""Guarded shortest remaining prefill first: overdue after the current FCFS wait."""

from __future__ import annotations

import pytest

from fairsched_plugin.config import ConfigError, load_config
from fairsched_plugin.policies import GuardedSRPF, PrefillRateEstimator, RequestView, make_policy
from fairsched_plugin.policies.guarded_srpf import MIN_RATE_STEPS


def calibrated(slack: float, tokens_per_s: float = 1000.0) -> GuardedSRPF:
    policy = GuardedSRPF(slack)
    for _ in range(MIN_RATE_STEPS):
        policy.observe_step(int(tokens_per_s * 0.01), 0.01, saturated=True)
    assert policy.rate.rate == pytest.approx(tokens_per_s)
    return policy


def test_uncalibrated_every_waiting_request_is_overdue_so_order_is_arrival():
    policy = GuardedSRPF(1.0)
    assert policy.current_fcfs_wait(5000) is None
    cutoff = policy.overdue_cutoff(now=100.5, backlog_tokens=5000)
    assert cutoff == 100.5
    rank = policy.ranker(cutoff)
    early_long = RequestView("a", 100.0, 4000)
    late_short = RequestView("b", 100.2, 10)
    assert rank(early_long) < rank(late_short)


def test_only_saturated_steps_measure_the_rate():
    policy = GuardedSRPF(1.0)
    for _ in range(MIN_RATE_STEPS):
        policy.observe_step(10, 0.01, saturated=False)
    assert policy.rate.rate is None


def test_cutoff_is_now_minus_slack_times_the_current_fcfs_wait():
    policy = calibrated(slack=1.5, tokens_per_s=1000.0)
    # 2,000 tokens queued at 1,000 tokens/s: FCFS would make a new request wait 2 s.
    assert policy.current_fcfs_wait(2000) == pytest.approx(2.0)
    assert policy.overdue_cutoff(now=10.0, backlog_tokens=2000) == pytest.approx(7.0)
    assert policy.overdue_cutoff(now=10.0, backlog_tokens=0) == pytest.approx(10.0)


def test_shortest_remaining_first_until_overdue_then_arrival_order():
    policy = calibrated(slack=1.0)
    long = RequestView("long", 10.0, 3000)
    short = RequestView("short", 11.0, 20)
    shorter = RequestView("shorter", 11.5, 5)
    views = [long, short, shorter]
    assert [v.request_id for v in sorted(views, key=policy.ranker(9.9))] == [
        "shorter", "short", "long"]
    # long arrived at the cutoff: overdue, first.
    assert [v.request_id for v in sorted(views, key=policy.ranker(10.0))] == [
        "long", "shorter", "short"]
    # All overdue: arrival order, whatever the lengths.
    assert [v.request_id for v in sorted(views, key=policy.ranker(12.0))] == [
        "long", "short", "shorter"]


def test_remaining_work_counts_computed_tokens():
    policy = GuardedSRPF(1.0)
    almost_done = RequestView("a", 1.0, 4000, computed_tokens=3990)
    fresh = RequestView("b", 2.0, 100)
    assert policy.key(almost_done) < policy.key(fresh)


def test_policies_without_the_guard_rank_by_their_key():
    aging = make_policy(load_config({"fairsched": {"policy": "aging"}}, {}))
    view = RequestView("a", 1.0, 10)
    assert aging.ranker(5.0)(view) == aging.key(view)
    with pytest.raises(NotImplementedError):
        aging.overdue_cutoff(1.0, 10)


def test_shared_rate_estimator_is_used():
    estimator = PrefillRateEstimator(min_steps=1)
    policy = GuardedSRPF(2.0, estimator)
    policy.observe_step(500, 0.5, saturated=True)
    assert policy.overdue_cutoff(10.0, 1000) == pytest.approx(8.0)  # 2 x 1,000 / 1,000 tok/s


def test_slack_must_be_positive():
    with pytest.raises(ConfigError, match="guarded_srpf.slack"):
        load_config({"fairsched": {"guarded_srpf": {"slack": 0}}}, {})
    assert load_config({"fairsched": {"guarded_srpf": {"slack": 0.5}}}, {}).guarded_srpf.slack == 0.5
