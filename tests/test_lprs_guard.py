"""The guard's window logic with plain numbers: when LPRS falls back, when it resumes."""

from __future__ import annotations

import math

import pytest

from fairsched_plugin.policies.lprs_guard import GuardParams, PredictionGuard

PARAMS = GuardParams(window=4, max_error=1.0, recover_error=0.5, min_fill=0.5)


def feed(guard: PredictionGuard, pairs, cut: bool = False) -> list[str | None]:
    return [guard.observe(predicted, measured, cut) for predicted, measured in pairs]


def test_nothing_is_judged_before_the_window_is_full():
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    assert feed(guard, [(100.0, 10.0)] * 3) == [None] * 3 and not guard.fallen_back
    cause = guard.observe(100.0, 10.0, False)
    assert guard.fallen_back
    assert cause is not None and "median relative error of the last 4 predictions is 9.00" in cause


def test_the_median_decides_not_an_outlier():
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    # Errors 0.1, 0.1, 9 (a pause), 0.2: median 0.15.
    feed(guard, [(11.0, 10.0), (9.0, 10.0), (100.0, 10.0), (12.0, 10.0)])
    assert not guard.fallen_back
    # Two more far-off predictions: errors 0.1, 9, 0.2, 9, 9 in the last four -> 9.
    feed(guard, [(100.0, 10.0), (100.0, 10.0)])
    assert guard.fallen_back


def test_an_error_exactly_at_the_threshold_does_not_fall_back():
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    feed(guard, [(20.0, 10.0)] * 8)  # error 1.0: not above 1.0
    assert not guard.fallen_back


def test_resuming_needs_a_fresh_window_of_agreement():
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    feed(guard, [(100.0, 10.0)] * 4)
    assert guard.fallen_back
    # The window was cleared: three agreeing predictions are not yet a judgement.
    assert feed(guard, [(10.0, 10.0)] * 3) == [None] * 3 and guard.fallen_back
    cause = guard.observe(10.0, 10.0, False)
    assert not guard.fallen_back
    assert cause is not None and "is 0.00, at most lprs.guard_recover_error 0.5" in cause
    assert guard.observe(100.0, 10.0, False) is None  # a fresh window again


def test_resuming_needs_the_median_error_at_most_the_recovery_threshold():
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    feed(guard, [(100.0, 10.0)] * 4)
    # Errors of 0.6: under max_error 1, but above recover_error 0.5.
    assert feed(guard, [(16.0, 10.0)] * 4) == [None] * 4 and guard.fallen_back
    assert guard.observe(10.5, 10.0, False) is None  # 0.6, 0.6, 0.6, 0.05: median 0.6
    assert guard.observe(10.5, 10.0, False) is not None  # 0.6, 0.6, 0.05, 0.05: 0.325
    assert not guard.fallen_back


def test_cutting_chunks_while_steps_stay_far_under_target_falls_back():
    """Right on the batches it dispatches (tiny ones), wrong on the ones it avoids."""
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    feed(guard, [(10.0, 10.0)] * 4, cut=True)  # 10 ms < 0.5 x 30 ms, cut in 4 of 4
    assert guard.fallen_back


@pytest.mark.parametrize(("cuts", "measured", "min_fill", "falls_back"), [
    (3, 10.0, 0.5, True),    # cut in 3 of 4 steps
    (2, 10.0, 0.5, False),   # cut in only half of them
    (4, 16.0, 0.5, False),   # steps at 16 ms: not under 15 ms
    (4, 10.0, 0.0, False),   # this test switched off
])
def test_the_cut_rule_needs_most_steps_cut_and_the_median_under_the_fill(
    cuts, measured, min_fill, falls_back
):
    guard = PredictionGuard(GuardParams(4, 1.0, 0.5, min_fill), target_ms=30.0)
    for i in range(4):
        guard.observe(measured, measured, i < cuts)
    assert guard.fallen_back is falls_back


def test_unusable_observations_are_skipped():
    guard = PredictionGuard(PARAMS, target_ms=30.0)
    feed(guard, [(math.nan, 10.0), (100.0, 0.0), (100.0, math.inf)] * 3)
    assert not guard.fallen_back
    feed(guard, [(100.0, 10.0)] * 4)
    assert guard.fallen_back


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"window": 0}, "window must be >= 1"),
    ({"recover_error": 2.0}, "recover_error <= max_error"),
    ({"recover_error": 0.0}, "recover_error <= max_error"),
    ({"min_fill": 1.5}, r"min_fill must be in \[0, 1\]"),
])
def test_params_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GuardParams(**{"window": 4, "max_error": 1.0, "recover_error": 0.5, "min_fill": 0.5,
                       **kwargs})
