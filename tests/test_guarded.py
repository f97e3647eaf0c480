"""The FCFS guard: deadlines in served prefill work, a two-lane order, and the two
policies it bounds (guarded-srpf and guarded-aging)."""

from __future__ import annotations

import math

import pytest

from fairsched_plugin.config import ConfigError, from_values, load_config
from fairsched_plugin.policies import GuardedAging, GuardedSRPF, RequestView, make_policy
from fairsched_plugin.policies.guarded import FcfsGuard, RecentExtreme
from fairsched_plugin.settings import GuardedAgingConfig, GuardedSRPFConfig


def _srpf(slack: float, window_s: float = 0.0, size_allowance: float = 0.0) -> GuardedSRPF:
    """The guard alone: no tail watch, running prefills kept first (the default)."""
    return GuardedSRPF(GuardedSRPFConfig(slack=slack, window_s=window_s,
                                         size_allowance=size_allowance, tail_window=0))


def test_deadline_is_the_served_work_plus_slack_times_the_backlog():
    guard = FcfsGuard(slack=1.5, window_s=0.0)
    assert guard.deadline(backlog_tokens=2000) == pytest.approx(3000)
    guard.observe_served(500)
    guard.observe_served(250)
    assert guard.deadline(backlog_tokens=2000) == pytest.approx(750 + 3000)


def test_a_deadline_is_never_earlier_than_one_given_before():
    """The backlog fell: the formula gives 750 + 1.5 x 1000, but a deadline before the
    last one would jump ahead of it in EDF order, so it takes the last one."""
    guard = FcfsGuard(slack=1.5, window_s=0.0)
    assert guard.deadline(backlog_tokens=2000, request_id="a") == pytest.approx(3000)
    guard.observe_served(750)
    assert guard.deadline(backlog_tokens=1000, request_id="b") == pytest.approx(3000)
    assert guard.position("a") < guard.position("b")


def test_without_the_size_allowance_a_request_at_an_empty_queue_is_overdue_at_once():
    """Nothing queued ahead: the deadline is the served work itself, so the long prompt
    that came first holds back every short one behind it (the chunked-prefill paper's head-of-line
    case)."""
    policy = _srpf(slack=1.25)
    first = RequestView("long", 1.0, 4000, deadline=policy.deadline(1.0, 0, 4000))
    policy.observe_backlog(1.0, 4000)
    second = RequestView("short", 1.1, 10, deadline=policy.deadline(1.1, 4000, 10))
    rank = policy.ranker(now=1.2)
    assert rank(first) < rank(second)


def test_the_size_allowance_lets_short_requests_pass_until_the_own_size_is_served():
    """With allowance 1, the long prompt that arrived first may be passed by up to its own
    prefill work (a bounded slowdown of 2 at an empty queue), then it is overdue."""
    policy = _srpf(slack=1.25, size_allowance=1.0)
    first = RequestView("long", 1.0, 4000, deadline=policy.deadline(1.0, 0, 4000))
    assert first.deadline == pytest.approx(4000)
    second = RequestView("short", 1.1, 10, deadline=policy.deadline(1.1, 4000, 10))
    assert second.deadline == pytest.approx(1.25 * 4000 + 10)
    assert policy.ranker(now=1.2)(second) < policy.ranker(now=1.2)(first)
    policy.observe_step(3999)
    assert policy.ranker(now=1.3)(second) < policy.ranker(now=1.3)(first)
    policy.observe_step(1)
    assert policy.ranker(now=1.4)(first) < policy.ranker(now=1.4)(second)


def test_the_window_keeps_the_largest_recent_backlog():
    guard = FcfsGuard(slack=1.0, window_s=30.0)
    guard.observe_backlog(6.0, 3000, 0)
    guard.observe_backlog(9.0, 500, 0)
    assert guard.deadline(backlog_tokens=500) == pytest.approx(3000)
    assert guard.deadline(backlog_tokens=4000) == pytest.approx(4000)
    guard.observe_backlog(37.0, 100, 0)  # the burst at 6 s left the window
    guard.observe_served(10_000)
    assert guard.deadline(backlog_tokens=100) == pytest.approx(10_000 + 500)


def test_without_a_window_only_the_own_backlog_counts():
    guard = FcfsGuard(slack=2.0, window_s=0.0)
    guard.observe_backlog(0.0, 3000, 0)
    guard.observe_backlog(0.5, 10, 0)
    assert guard.deadline(backlog_tokens=10) == pytest.approx(20)


def test_recent_max_is_a_sliding_window_maximum():
    window = RecentExtreme(10.0)
    assert window.value == 0.0
    for t, v in [(0, 5.0), (1, 3.0), (2, 4.0), (3, 1.0)]:
        window.observe(t, v)
    assert window.value == 5.0
    window.observe(10.5, 0.5)  # 5.0 at t=0 left the window; 4.0 at t=2 is the largest now
    assert window.value == 4.0
    window.observe(13.0, 0.2)
    assert window.value == 1.0


def test_shortest_remaining_first_until_the_served_work_reaches_the_deadline():
    policy = _srpf(slack=1.0)
    long = RequestView("long", 10.0, 3000, deadline=2000)
    short = RequestView("short", 11.0, 20, deadline=5000)
    shorter = RequestView("shorter", 11.5, 5, deadline=6000)
    views = [long, short, shorter]
    policy.observe_step(1999)
    assert [v.request_id for v in sorted(views, key=policy.ranker(now=11.9))] == [
        "shorter", "short", "long"]
    policy.observe_step(1)
    assert [v.request_id for v in sorted(views, key=policy.ranker(now=11.9))] == [
        "long", "shorter", "short"]
    # Overdue requests go earliest deadline first, whatever their length.
    policy.observe_step(10_000)
    assert [v.request_id for v in sorted(views, key=policy.ranker(now=11.9))] == [
        "long", "short", "shorter"]


def test_time_alone_makes_no_request_overdue():
    policy = _srpf(slack=1.0)
    view = RequestView("a", 1.0, 100, deadline=50)
    assert policy.ranker(now=1e9)(view)[0] == 1
    assert policy.overdue_cutoff(now=1e9) == 0


def test_remaining_work_counts_computed_tokens():
    policy = _srpf(slack=1.0, window_s=30.0)
    almost_done = RequestView("a", 1.0, 4000, computed_tokens=3990, deadline=math.inf)
    fresh = RequestView("b", 2.0, 100, deadline=math.inf)
    assert policy.key(almost_done) < policy.key(fresh)


def test_guarded_aging_orders_by_aging_inside_the_guard():
    policy = GuardedAging(GuardedAgingConfig(slack=1.0, window_s=0.0, auto_factor=0.25))
    assert policy.alpha is None and policy.auto_factor == 0.25
    old_long = RequestView("old", 0.0, 1000, deadline=10_000)
    new_short = RequestView("new", 1.0, 100, deadline=10_000)
    policy.set_alpha(100.0)  # one second of waiting is worth 100 prompt tokens
    assert policy.key(new_short) < policy.key(old_long)
    policy.set_alpha(2000.0)
    assert policy.key(old_long) < policy.key(new_short)
    policy.observe_step(10_000)  # both overdue: earliest deadline, then arrival
    rank = policy.ranker(now=5.0)
    assert rank(old_long) < rank(new_short)


def test_policies_without_deadlines_rank_by_their_key():
    aging = make_policy(load_config({"fairsched": {"policy": "aging"}}, {}))
    view = RequestView("a", 1.0, 10)
    assert aging.ranker(now=5.0)(view) == aging.key(view)
    with pytest.raises(NotImplementedError):
        aging.deadline(1.0, 10, 10)


def test_config_makes_the_policies_and_checks_their_keys():
    policy = make_policy(load_config({"fairsched": {"policy": "guarded-srpf",
                                                    "guarded_srpf": {"slack": 2, "window_s": 5}}},
                                     {}))
    assert isinstance(policy, GuardedSRPF)
    assert (policy.guard.slack, policy.guard.recent_backlog.window_s) == (2.0, 5.0)
    aging = make_policy(from_values({"policy": "guarded-aging",
                                     "guarded_aging": {"slack": 1.5, "auto_factor": 0.5}}))
    assert isinstance(aging, GuardedAging)
    assert (aging.guard.slack, aging.auto_factor) == (1.5, 0.5)
    with pytest.raises(ConfigError, match="guarded_srpf.slack"):
        load_config({"fairsched": {"guarded_srpf": {"slack": 0}}}, {})
    with pytest.raises(ConfigError, match="guarded_srpf.window_s"):
        load_config({}, {"FAIRSCHED_GUARDED_SRPF_WINDOW_S": "-1"})
    with pytest.raises(ConfigError, match="guarded_srpf.size_allowance"):
        load_config({}, {"FAIRSCHED_GUARDED_SRPF_SIZE_ALLOWANCE": "-0.5"})
    with pytest.raises(ConfigError, match="guarded_aging.auto_factor"):
        load_config({}, {"FAIRSCHED_GUARDED_AGING_AUTO_FACTOR": "0"})


def test_with_persist_s_slack_is_earned_only_by_a_backlog_that_persisted():
    """A burst after an idle spell earns no slack (its deadline is the FCFS start); a
    backlog that never drained over the window earns slack on that persisting part."""
    guard = FcfsGuard(slack=2.0, window_s=0.0, persist_s=10.0)
    guard.observe_backlog(0.0, 0, 0)
    guard.observe_backlog(5.0, 8000, 0)
    assert guard.deadline(backlog_tokens=8000) == pytest.approx(8000)
    guard.observe_backlog(11.0, 6000, 0)  # the idle point at 0 s left the window
    guard.observe_backlog(14.0, 7000, 0)
    assert guard.deadline(backlog_tokens=7000) == pytest.approx(7000 + 6000)


def test_recent_min_is_a_sliding_window_minimum():
    window = RecentExtreme(10.0, smallest=True)
    for t, v in [(0, 1.0), (1, 3.0), (2, 2.0), (3, 5.0)]:
        window.observe(t, v)
    assert window.value == 1.0
    window.observe(10.5, 4.0)  # 1.0 at t=0 left; 2.0 at t=2 is the smallest now
    assert window.value == 2.0
