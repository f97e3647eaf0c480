"""The guard's tail watch: FCFS's wait on the served-work timeline, computed by hand, and
the gain it steers (``policies.tail_watch``)."""

from __future__ import annotations

import pytest

from fairsched_plugin.policies.guarded import FcfsGuard
from fairsched_plugin.policies.tail_watch import MIN_GAIN, RECOVERY, TailWatch, tail_mean


def _serve(watch: TailWatch, requests: list[tuple[str, float, float, float]],
           steps: list[tuple[float, float]]) -> None:
    """Requests as (id, arrival, FCFS point, own prefill end); steps as (time, served
    total), all in time order."""
    events = [(t, 0, r) for r in requests for t in (r[1],)]
    events += [(t, 1, s) for s in steps for t in (s[0],)]
    events += [(r[3], 2, r) for r in requests]
    for _, kind, item in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            watch.arrived(item[0], item[1], item[2])
        elif kind == 1:
            watch.served(item[0], item[1])
        else:
            watch.prefill_done(item[0], item[3])


def test_fcfs_wait_is_when_the_served_work_crossed_the_point():
    watch = TailWatch(window=8)
    # Served work: 100 tokens a second from t=0.
    steps = [(t / 10, 10.0 * t) for t in range(1, 400)]
    # a: FCFS point 500 (crossed at t=5.0), prefill done at 2.0: promoted.
    # b: FCFS point 300 (crossed at t=3.0), prefill done at 7.0: delayed.
    _serve(watch, [("a", 1.0, 500.0, 2.0), ("b", 0.5, 300.0, 7.0)], steps)
    assert list(watch._served_wait) == pytest.approx([1.0, 6.5])
    assert list(watch._fcfs_wait) == pytest.approx([4.0, 2.5])


STEPS = [(t / 10, 10.0 * t) for t in range(1, 4000)]
"""100 served tokens a second."""


def _late(n: int, first: int = 0) -> list[tuple[str, float, float, float]]:
    """Requests whose prefill ends 2 s after FCFS's (FCFS: 0.5 s after arrival)."""
    return [(f"late{i}", float(i), 100.0 * i + 50, i + 0.5 + 2.0)
            for i in range(first, first + n)]


def _promoted(n: int, first: int) -> list[tuple[str, float, float, float]]:
    """Requests served 0.1 s after arrival where FCFS takes 0.5 s."""
    return [(f"fast{i}", float(i), 100.0 * i + 50, i + 0.1) for i in range(first, first + n)]


def _fair(n: int, first: int) -> list[tuple[str, float, float, float]]:
    """Requests served exactly when FCFS would have served them."""
    return [(f"fair{i}", float(i), 100.0 * i + 50, i + 0.5) for i in range(first, first + n)]


def test_the_gain_starts_at_arrival_order_and_probes_after_two_judgements():
    watch = TailWatch(window=8)
    assert watch.gain == 0.0
    _serve(watch, _fair(4, 0), STEPS[:100])  # the first judgement (window // 2)
    assert watch.gain == 0.0
    _serve(watch, _fair(2, 10), STEPS[100:200])  # the second (every window // 4)
    assert watch.gain == RECOVERY and watch.step_backs == 0


def test_a_shorter_mean_and_a_tail_within_fcfs_raise_the_gain():
    watch = TailWatch(window=8)
    watch.gain = 0.5
    _serve(watch, _promoted(4, 0), STEPS)
    assert watch.gain == 0.5 + RECOVERY and watch.step_backs == 0
    assert watch.last_ratio < 1


def test_a_served_tail_longer_than_fcfs_halves_the_gain_and_counts_a_step_back():
    watch = TailWatch(window=8)
    watch.gain = 1.0
    _serve(watch, _late(4), STEPS[:200])
    assert watch.gain == 0.5 and watch.step_backs == 1
    assert watch.last_ratio > 1.02


def test_reordering_that_buys_nothing_halves_the_gain_without_a_step_back():
    watch = TailWatch(window=8)
    watch.gain = 0.5
    _serve(watch, _fair(4, 0), STEPS)
    assert watch.gain == 0.25 and watch.step_backs == 0


def test_the_gain_reaches_zero_below_the_minimum():
    watch = TailWatch(window=8)
    watch.gain = MIN_GAIN
    _serve(watch, _late(4), STEPS)
    assert watch.gain == 0.0


def test_requests_that_arrived_under_another_gain_are_not_judged():
    watch = TailWatch(window=8)
    watch.gain = 1.0
    watch.arrived("old", 0.0, 50.0)
    _serve(watch, _late(4), STEPS[:100])  # the judgement after these changes the gain
    assert watch.gain == 0.5
    watch.prefill_done("old", 12.0)
    assert len(watch._served_wait) == 0


def test_tail_mean_is_the_mean_of_the_worst_five_percent():
    assert tail_mean([float(v) for v in range(100)]) == pytest.approx((99 + 98 + 97 + 96 + 95) / 5)
    assert tail_mean([3.0, 1.0]) == 3.0


def test_the_gain_scales_the_slack_and_the_allowance_of_new_deadlines():
    guard = FcfsGuard(slack=1.5, window_s=0.0, size_allowance=1.0, tail_window=8)
    guard.observe_served(1000)
    # Gain 0: due at once, so deadline order (arrival order) is the order.
    assert guard.deadline(2000, 100) == pytest.approx(1000)
    guard.watch.gain = 1.0
    assert guard.deadline(2000, 100) == pytest.approx(1000 + 2000 + 1000 + 100)
    guard.watch.gain = 0.5
    assert guard.deadline(8000, 100) == pytest.approx(1000 + 8000 + 2000 + 50)
    assert FcfsGuard(slack=1.5, window_s=0.0).gain == 1.0  # no watch: the configured slack


def test_a_window_below_eight_is_refused():
    with pytest.raises(ValueError, match="window"):
        TailWatch(window=4)
