"""LPRS (Algorithm 1, Eq. 6-11), APC (Eq. 12-14) and chunk alignment against hand-worked
cases, with plain functions as predictors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fairsched_plugin.config import from_values
from fairsched_plugin.policies.alignment import align_chunk
from fairsched_plugin.policies.apc import (
    ActivePrefillControl,
    Outcome,
    activity_cap,
    decide,
    min_progress,
)
from fairsched_plugin.policies.lprs import (
    LPRSParams,
    PredictionError,
    candidate_chunks,
    select_chunk,
)

PARAMS = LPRSParams(target_ms=50.0, granularity=32, underfill_penalty=1.0,
                    overflow_penalty=4.0)


def linear(base_ms: float, per_token_ms: float):
    return lambda chunks: base_ms + per_token_ms * chunks.astype(float)


def select(bound: int, predict, params: LPRSParams = PARAMS):
    """Algorithm 1 for one candidate whose batch times ``predict`` gives."""
    chunks = candidate_chunks(bound, params.granularity)
    return select_chunk(chunks, np.asarray(predict(chunks), dtype=np.float64), params)


# ------------------------------------------------------------------ LPRS


def test_candidate_set_is_one_h_and_multiples_of_the_granularity():
    assert candidate_chunks(100, 32).tolist() == [1, 32, 64, 96, 100]
    assert candidate_chunks(64, 32).tolist() == [1, 32, 64]
    assert candidate_chunks(20, 32).tolist() == [1, 20]
    assert candidate_chunks(1, 32).tolist() == [1]
    assert candidate_chunks(0, 32).tolist() == []


def test_scores_are_asymmetric():
    # Eq. 10 with penalties 1 and 4: 40 ms scores 10, 55 ms scores 20, 52 ms scores 8.
    chunks = np.array([1, 2])
    assert select_chunk(chunks, np.array([40.0, 55.0]), PARAMS).chunk == 1
    assert select_chunk(chunks, np.array([40.0, 52.0]), PARAMS).chunk == 2
    assert select_chunk(chunks, np.array([45.0, 52.0]), PARAMS).chunk == 1  # 5 against 8


def test_select_hits_the_target_exactly_when_a_candidate_does():
    # 10 ms fixed + 0.25 ms/token: 160 tokens -> 50 ms; 160 = 5 x 32 is a candidate.
    choice = select(256, linear(10, 0.25))
    assert (choice.chunk, choice.predicted_ms, choice.candidates, choice.index) == (
        160, 50.0, 9, 5)


def test_select_prefers_underfill_to_a_smaller_overflow():
    # 0.3 ms/token: 128 -> 48.4 ms (1.6 under, score 1.6); 160 -> 58 ms (8 over, score 32).
    choice = select(256, linear(10, 0.3))
    assert choice.chunk == 128
    # With equal penalties the closer candidate would win, and that is still 128 here;
    # make 160 closer: 0.25 ms/token + 9 ms -> 128: 41 (9 under), 160: 49 (1 under).
    assert select(256, linear(9, 0.25)).chunk == 160


def test_ties_go_to_the_larger_chunk():
    flat = lambda chunks: np.full(len(chunks), 30.0)  # noqa: E731
    assert select(100, flat).chunk == 100


def test_a_batch_already_over_target_gets_the_smallest_chunk():
    # Decodes alone take 70 ms: every chunk overflows; the least overflow is one token.
    assert select(256, linear(70, 0.1)).chunk == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_nonsense_predictions_raise(bad):
    predict = lambda chunks: np.where(chunks == 32, bad, 10.0)  # noqa: E731
    with pytest.raises(PredictionError):
        select(100, predict)


def test_wrong_shape_is_nonsense():
    with pytest.raises(PredictionError):
        select(100, lambda chunks: np.array([1.0, 2.0]))


def test_no_room_means_no_chunk():
    assert select(0, linear(10, 0.1)).chunk == 0


def test_candidate_sets_are_cached_and_read_only():
    assert candidate_chunks(100, 32) is candidate_chunks(100, 32)
    with pytest.raises(ValueError):
        candidate_chunks(100, 32)[0] = 5


def test_params_reject_overflow_not_above_underfill():
    with pytest.raises(ValueError, match="underfill < overflow"):
        from_values({"lprs": {"underfill_penalty": 2.0, "overflow_penalty": 2.0}})


# ------------------------------------------------------------------ APC


def test_activity_cap_eq12_takes_the_tightest_bound():
    # C_max 8, slots 16 - 10 decodes = 6, budget (256 - 10) // 16 = 15 -> 6
    assert activity_cap(8, 16, 10, 256, 10, 16) == 6
    # budget-bound: (256 - 200) // 16 = 3
    assert activity_cap(8, 64, 10, 256, 200, 16) == 3
    # C_max-bound
    assert activity_cap(2, 64, 0, 4096, 0, 16) == 2
    # never negative
    assert activity_cap(8, 4, 10, 256, 0, 16) == 0


def test_min_progress_eq13():
    assert min_progress(100, 16) == 16
    assert min_progress(5, 16) == 5


@pytest.mark.parametrize(
    "proposed, bound, remaining, active, cap, started, expected",
    [
        (64, 200, 500, 1, 4, True, (64, Outcome.ACCEPTED)),         # under cap, >= m
        (64, 200, 500, 4, 4, True, (0, Outcome.BLOCKED_BY_CAP)),    # cap reached
        (64, 200, 64, 4, 4, True, (64, Outcome.ACCEPTED)),          # cap reached, finishes
        (8, 200, 500, 1, 4, True, (0, Outcome.BLOCKED_BY_MIN_CHUNK)),  # too small, others active
        (8, 200, 500, 0, 4, False, (16, Outcome.WARM_START)),       # too small, no prefill yet
        # too small, the batch's prefills all finish: prefill is running, no warm start
        (8, 200, 500, 0, 4, True, (0, Outcome.BLOCKED_BY_MIN_CHUNK)),
        (1, 10, 500, 0, 0, False, (10, Outcome.WARM_START)),        # warm start capped by h
        (5, 200, 5, 2, 4, True, (5, Outcome.ACCEPTED)),             # final remainder: m = r
    ],
)
def test_decision_rule_eq14(proposed, bound, remaining, active, cap, started, expected):
    assert decide(proposed, bound, remaining, active, cap, 16, started) == expected


def test_warm_start_makes_progress_when_no_prefill_is_active():
    apc = ActivePrefillControl(max_active=4, min_chunk=16, max_deferred_steps=8)
    apc.begin_step(max_seqs=64, num_decodes=60, token_budget=256, committed=250)
    assert apc.cap == 0  # (256 - 250) // 16 = 0: no room for a useful chunk
    assert apc.choose("r", proposed=1, bound=6, remaining=300) == 6
    assert apc.counts["warm_start"] == 1


def test_deferral_is_bounded_so_nothing_starves():
    apc = ActivePrefillControl(max_active=1, min_chunk=16, max_deferred_steps=3)
    served = []
    for step in range(10):
        apc.begin_step(max_seqs=64, num_decodes=0, token_budget=256, committed=0)
        assert apc.choose("first", 64, 256, 10_000) == 64  # takes the only active slot
        served.append(apc.choose("second", 64, 192, 10_000))
    # Held back three considered steps in a row, then forced once, and so on.
    assert served == [0, 0, 0, 64, 0, 0, 0, 64, 0, 0]
    assert apc.counts == {"accepted": 1, "warm_start": 0, "blocked_by_cap": 1,
                          "blocked_by_min_chunk": 0, "forced": 0}
    apc.forget("second")
    assert "second" not in apc.deferred


# ------------------------------------------------------------------ alignment


@pytest.mark.parametrize(
    "computed, chunk, remaining, block, expected",
    [
        (0, 200, 1000, 128, 128),   # ends at 128
        (100, 200, 1000, 128, 156),  # ends at 256
        (0, 100, 1000, 128, 0),      # no boundary in reach
        (0, 300, 300, 128, 300),     # final chunk: unaligned
        (0, 200, 1000, 1, 200),      # block size 1: nothing to align
    ],
)
def test_chunk_ends_align_down_except_the_final_chunk(computed, chunk, remaining, block, expected):
    assert align_chunk(computed, chunk, remaining, block) == expected


def test_holds_back_exactly_when_no_proposal_could_get_through():
    apc = ActivePrefillControl(max_active=1, min_chunk=16, max_deferred_steps=2)
    apc.begin_step(max_seqs=64, num_decodes=0, token_budget=256, committed=0)
    assert not apc.holds_back("a", False)  # nothing active yet
    apc.choose("a", 64, 256, 1000)
    assert apc.holds_back("b", False)
    for proposed in (1, 16, 192):
        assert decide(proposed, 192, 1000, apc.active, apc.cap, 16, apc.started)[0] == 0
    # A bound that can finish the prompt: the finishing chunk gets through the cap.
    assert not apc.holds_back("b", True)
    assert decide(150, 192, 150, apc.active, apc.cap, 16, apc.started)[0] == 150
    apc.deferred["b"] = 2  # due to be forced: it must be asked
    assert not apc.holds_back("b", False)


def test_a_chunk_that_finishes_its_prompt_neither_needs_nor_takes_an_active_slot():
    """The cap counts unfinished prefills: a burst of short prompts all go in one step
    behind a long one, which still holds the only slot."""
    apc = ActivePrefillControl(max_active=1, min_chunk=16, max_deferred_steps=8)
    apc.begin_step(max_seqs=64, num_decodes=0, token_budget=2048, committed=0)
    assert apc.choose("long", 512, 2048, 10_000) == 512
    assert [apc.choose(f"short{i}", 100, 1536, 100) for i in range(5)] == [100] * 5
    assert apc.active == 1
    assert apc.choose("other-long", 512, 1036, 5_000) == 0  # unfinished: blocked by the cap
    # A too-small chunk gets no warm start in a batch whose prefills all finish.
    apc.begin_step(max_seqs=64, num_decodes=0, token_budget=2048, committed=0)
    assert apc.choose("short", 100, 2048, 100) == 100 and apc.active == 0
    assert apc.choose("tiny", 4, 2048, 5_000) == 0


def test_would_choose_is_choose_for_a_given_batch_without_recording():
    apc = ActivePrefillControl(max_active=2, min_chunk=16, max_deferred_steps=2)
    apc.begin_step(max_seqs=64, num_decodes=0, token_budget=256, committed=0)
    apc.deferred["late"] = 2  # due to be forced
    cases = [("a", 64, 200, 500), ("b", 8, 200, 500), ("late", 64, 200, 500),
             ("short", 100, 200, 100), ("short-cut", 50, 200, 100)]
    for active, started in ((0, False), (0, True), (1, True), (2, True)):
        for request_id, proposed, bound, remaining in cases:
            snapshot = (dict(apc.deferred), dict(apc.counts), apc.active)
            assumed = apc.would_choose(request_id, proposed, bound, remaining, active, started)
            assert apc.holds_back(request_id, bound >= remaining, active) == (
                active >= 2 and request_id not in ("late", "short", "short-cut"))
            assert (dict(apc.deferred), dict(apc.counts), apc.active) == snapshot
            real = ActivePrefillControl(2, 16, 2, cap=apc.cap, active=active, started=started,
                                        deferred=dict(apc.deferred))
            assert real.choose(request_id, proposed, bound, remaining) == assumed
