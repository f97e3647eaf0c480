"""The guard's tail watch: FCFS's wait on the served-work timeline, computed by hand, and
the gain it steers (``policies.tail_watch``)."""

from __future__ import annotations

import pytest

from fairsched_plugin.policies.guarded import FcfsGuard
from fairsched_plugin.policies.tail_watch import (
    MAX_BACKOFF,
    MIN_GAIN,
    PROBE_AFTER,
    TailWatch,
    tail_mean,
)


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


def test_the_gain_starts_at_arrival_order_and_probes_after_some_judgements():
    watch = TailWatch(window=16)  # judged every 2 requests
    assert watch.gain == 0.0
    _serve(watch, _fair(2 * PROBE_AFTER - 2, 0), STEPS[:200])
    assert watch.gain == 0.0
    _serve(watch, _fair(2, 20), STEPS[200:300])
    assert watch.gain == MIN_GAIN and watch.step_backs == 0


def test_a_shorter_mean_and_a_tail_within_fcfs_raise_the_gain_on_half_a_window():
    watch = TailWatch(window=16)
    watch.gain = 0.5
    _serve(watch, _promoted(6, 0), STEPS[:100])
    assert watch.gain == 0.5  # three judgements: no harm, too few to raise the gain
    _serve(watch, _promoted(2, 10), STEPS[100:200])
    assert watch.gain == 1.0 and watch.step_backs == 0  # doubled
    assert watch.last_ratio < 1


def test_a_served_tail_longer_than_fcfs_goes_back_to_arrival_order_at_once():
    watch = TailWatch(window=16)
    watch.gain = 1.0
    _serve(watch, _late(2), STEPS[:100])
    assert watch.gain == 1.0  # too few waits for a tail
    _serve(watch, _late(2, 10), STEPS[100:200])
    assert watch.gain == 0.0 and watch.step_backs == 1
    assert watch.last_ratio > 1.02 and watch.last_measure == "TTFT"


def test_reordering_that_buys_nothing_halves_the_gain_without_a_step_back():
    watch = TailWatch(window=16)
    watch.gain = 0.5
    _serve(watch, _fair(8, 0), STEPS)
    assert watch.gain == 0.25 and watch.step_backs == 0


def test_the_gain_reaches_zero_below_the_minimum():
    watch = TailWatch(window=16)
    watch.gain = MIN_GAIN
    _serve(watch, _fair(8, 0), STEPS)
    assert watch.gain == 0.0


def test_each_harm_doubles_the_wait_for_the_next_probe():
    watch = TailWatch(window=16)
    _serve(watch, _fair(2 * PROBE_AFTER, 0), STEPS[:300])
    assert watch.gain == MIN_GAIN
    _serve(watch, _late(4, 30), STEPS[300:400])
    assert watch.gain == 0.0 and watch.step_backs == 1
    _serve(watch, _fair(4 * PROBE_AFTER - 2, 40), STEPS[400:800])
    assert watch.gain == 0.0
    _serve(watch, _fair(2, 80), STEPS[800:900])
    assert watch.gain == MIN_GAIN
    # A probe that finds a gain undoes the doubling.
    _serve(watch, _promoted(8, 90), STEPS[900:1000])
    assert watch.gain == 2 * MIN_GAIN
    watch.gain, watch._at_zero = 0.0, 0
    _serve(watch, _fair(2 * PROBE_AFTER, 100), STEPS[1000:1200])
    assert watch.gain == MIN_GAIN
    assert MAX_BACKOFF >= 1


def test_requests_that_arrived_under_another_gain_are_not_judged():
    watch = TailWatch(window=16)
    watch.gain = 1.0
    watch.arrived("old", 0.0, 50.0)
    _serve(watch, _late(4), STEPS[:100])  # the judgement after these changes the gain
    assert watch.gain == 0.0
    watch.prefill_done("old", 12.0)
    assert len(watch._served_wait) == 0


def _step(watch: TailWatch, now: float, total: float, done: tuple[str, ...] = ()) -> None:
    """One planned step, as the guard reports it: the prefills it finishes, then the work."""
    for request_id in done:
        watch.prefill_done(request_id, now)
    watch.served(now, total)


def test_a_decode_is_judged_over_its_own_steps_and_over_those_after_its_fcfs_point():
    watch = TailWatch(window=16)
    watch.gain = 1.0
    # Ten slow steps (1 s, a long prompt's prefill), then fast ones (0.1 s). "a" is
    # served first and decodes 4 tokens through the slow steps; FCFS would have served
    # it once the served work reached 1100, at step 10, and it would have decoded in
    # the fast ones.
    times = [float(t) for t in range(11)] + [10 + 0.1 * t for t in range(1, 30)]
    watch.arrived("a", 0.0, 1100.0)
    for step, now in enumerate(times[:6]):
        _step(watch, now, 100.0 * (step + 1), ("a",) if step == 0 else ())
    watch.forget("a", output_tokens=5)
    for step, now in enumerate(times[6:], start=6):
        _step(watch, now, 100.0 * (step + 1))
    assert list(watch._served_tpot) == pytest.approx([1.0])  # steps 0-4
    assert list(watch._fcfs_tpot) == pytest.approx([0.1])  # steps 10-14


def test_decodes_slowed_against_fcfs_step_the_guard_back():
    watch = TailWatch(window=16)  # decodes judged once 8 have finished
    watch.gain = 1.0
    times = [float(t) for t in range(11)] + [10 + 0.1 * t for t in range(1, 9)]
    decoding = [f"d{i}" for i in range(8)]
    for name in decoding:
        watch.arrived(name, 0.0, 1100.0)
    for step, now in enumerate(times[:6]):
        _step(watch, now, 100.0 * (step + 1), tuple(decoding) if step == 0 else ())
    for name in decoding:
        watch.forget(name, output_tokens=5)
    # Later requests served as FCFS would have: their waits show no harm, and their
    # judgement at step 18 reads the decodes, all judged by step 14.
    for step, now in enumerate(times[6:], start=6):
        total = 100.0 * (step + 1)
        if step >= 16:
            watch.arrived(f"fair{step}", now, total + 100.0)
        _step(watch, now, total, (f"fair{step - 1}",) if step >= 17 else ())
    assert watch.gain == 0.0 and watch.step_backs == 1
    assert watch.last_measure == "TPOT" and watch.last_ratio == pytest.approx(10.0)


def test_step_times_are_kept_only_as_far_back_as_a_live_request_reaches():
    watch = TailWatch(window=16)
    watch.arrived("a", 0.0, 10.0**9)
    for step in range(3000):
        _step(watch, step * 0.01, float(step), ("a",) if step == 100 else ())
    assert watch._times_base == 100  # "a"'s first token
    watch.forget("a", output_tokens=1)  # no decode to judge
    for step in range(3000, 5000):
        _step(watch, step * 0.01, float(step))
    assert watch._times_base > 3000


def test_tail_mean_is_the_mean_of_the_worst_five_percent():
    assert tail_mean([float(v) for v in range(100)]) == pytest.approx((99 + 98 + 97 + 96 + 95) / 5)
    assert tail_mean([3.0, 1.0]) == 3.0


def test_the_gain_scales_the_slack_and_the_allowance_of_new_deadlines():
    guard = FcfsGuard(slack=1.5, window_s=0.0, size_allowance=1.0, tail_window=8)
    guard.observe_served(1000)
    # Gain 0: due at once, so deadline order (arrival order) is the order.
    assert guard.deadline(2000, 100) == pytest.approx(1000)
    assert guard.cutoff == pytest.approx(1000)
    guard.watch.gain = 1.0
    assert guard.deadline(2000, 100) == pytest.approx(1000 + 2000 + 1000 + 100)
    guard.watch.gain = 0.5
    assert guard.deadline(8000, 100) == pytest.approx(1000 + 8000 + 2000 + 50)
    assert FcfsGuard(slack=1.5, window_s=0.0).gain == 1.0  # no watch: the configured slack


def test_a_window_below_eight_is_refused():
    with pytest.raises(ValueError, match="window"):
        TailWatch(window=4)
