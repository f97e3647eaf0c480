"""Guarded shortest remaining prefill first: deadlines from FCFS waits, two-lane order."""

from __future__ import annotations

import math

import pytest

from fairsched_plugin.config import ConfigError, load_config
from fairsched_plugin.policies import GuardedSRPF, PrefillRateEstimator, RequestView, make_policy
from fairsched_plugin.policies.guarded_srpf import MIN_RATE_STEPS, RecentMax


def calibrated(slack: float = 1.0, window_s: float = 30.0,
               tokens_per_s: float = 1000.0) -> GuardedSRPF:
    policy = GuardedSRPF(slack, window_s)
    for _ in range(MIN_RATE_STEPS):
        policy.observe_step(int(tokens_per_s * 0.01), 0.01, saturated=True)
    assert policy.rate.rate == pytest.approx(tokens_per_s)
    return policy


def test_uncalibrated_deadline_is_the_arrival_so_order_is_fcfs():
    policy = GuardedSRPF(1.0, 30.0)
    assert policy.deadline(100.0, backlog_tokens=5000) == 100.0
    policy.observe_backlog(100.0, 5000)  # nothing to measure yet
    assert policy.recent_wait.value == 0.0
    rank = policy.ranker(now=100.5)
    early_long = RequestView("a", 100.0, 4000, deadline=policy.deadline(100.0, 0))
    late_short = RequestView("b", 100.2, 10, deadline=policy.deadline(100.2, 4000))
    assert rank(early_long) < rank(late_short)


def test_only_saturated_steps_measure_the_rate():
    policy = GuardedSRPF(1.0, 30.0)
    for _ in range(MIN_RATE_STEPS):
        policy.observe_step(10, 0.01, saturated=False)
    assert policy.rate.rate is None


def test_deadline_is_slack_times_the_larger_of_own_and_recent_fcfs_wait():
    policy = calibrated(slack=1.5)
    # 2,000 tokens ahead at 1,000 tokens/s: FCFS would wait 2 s.
    assert policy.deadline(10.0, backlog_tokens=2000) == pytest.approx(13.0)
    # A burst 4 s ago made the FCFS wait 3 s: a request arriving now may wait that long.
    policy.observe_backlog(6.0, 3000)
    policy.observe_backlog(9.0, 500)
    assert policy.deadline(10.0, backlog_tokens=500) == pytest.approx(10.0 + 1.5 * 3.0)
    assert policy.deadline(10.0, backlog_tokens=4000) == pytest.approx(10.0 + 1.5 * 4.0)


def test_the_recent_wait_is_forgotten_after_the_window():
    policy = calibrated(window_s=30.0)
    policy.observe_backlog(0.0, 3000)
    policy.observe_backlog(31.0, 100)
    assert policy.recent_wait.value == pytest.approx(0.1)
    assert policy.deadline(31.0, 100) == pytest.approx(31.1)


def test_recent_max_is_a_sliding_window_maximum():
    window = RecentMax(10.0)
    assert window.value == 0.0
    for t, v in [(0, 5.0), (1, 3.0), (2, 4.0), (3, 1.0)]:
        window.observe(t, v)
    assert window.value == 5.0
    window.observe(10.5, 0.5)  # 5.0 at t=0 left the window; 4.0 at t=2 is the largest now
    assert window.value == 4.0
    window.observe(13.0, 0.2)
    assert window.value == 1.0


def test_shortest_remaining_first_until_the_deadline_then_overdue_first():
    policy = calibrated()
    long = RequestView("long", 10.0, 3000, deadline=12.0)
    short = RequestView("short", 11.0, 20, deadline=15.0)
    shorter = RequestView("shorter", 11.5, 5, deadline=16.0)
    views = [long, short, shorter]
    assert [v.request_id for v in sorted(views, key=policy.ranker(now=11.9))] == [
        "shorter", "short", "long"]
    assert [v.request_id for v in sorted(views, key=policy.ranker(now=12.0))] == [
        "long", "shorter", "short"]
    # Overdue requests go earliest deadline first, whatever their length.
    assert [v.request_id for v in sorted(views, key=policy.ranker(now=20.0))] == [
        "long", "short", "shorter"]


def test_remaining_work_counts_computed_tokens():
    policy = GuardedSRPF(1.0, 30.0)
    almost_done = RequestView("a", 1.0, 4000, computed_tokens=3990, deadline=math.inf)
    fresh = RequestView("b", 2.0, 100, deadline=math.inf)
    assert policy.key(almost_done) < policy.key(fresh)


def test_policies_without_deadlines_rank_by_their_key():
    aging = make_policy(load_config({"fairsched": {"policy": "aging"}}, {}))
    view = RequestView("a", 1.0, 10)
    assert aging.ranker(now=5.0)(view) == aging.key(view)
    with pytest.raises(NotImplementedError):
        aging.deadline(1.0, 10)


def test_shared_rate_estimator_is_used():
    estimator = PrefillRateEstimator(min_steps=1)
    policy = GuardedSRPF(2.0, 30.0, estimator)
    policy.observe_step(500, 0.5, saturated=True)
    assert policy.deadline(0.0, 1000) == pytest.approx(2.0)  # 2 x 1,000 / 1,000 tokens/s


def test_config_makes_the_policy_and_checks_its_keys():
    policy = make_policy(load_config({"fairsched": {"guarded_srpf": {"slack": 2, "window_s": 5}}},
                                     {}))
    assert isinstance(policy, GuardedSRPF)
    assert (policy.slack, policy.recent_wait.window_s) == (2.0, 5.0)
    with pytest.raises(ConfigError, match="guarded_srpf.slack"):
        load_config({"fairsched": {"guarded_srpf": {"slack": 0}}}, {})
    with pytest.raises(ConfigError, match="guarded_srpf.window_s"):
        load_config({}, {"FAIRSCHED_GUARDED_SRPF_WINDOW_S": "-1"})
