"""The ordering-policies paper's orderings (Table 1), pure: each policy's defining behaviour, with
plain request views and explicit clocks."""

from __future__ import annotations

import random

import pytest

from fairsched_plugin.config import AFLCBConfig, from_values, load_config
from fairsched_plugin.policies import (
    AFLCBPolicy,
    AgingShortestPromptFirst,
    EstimatedShortestTokensFirst,
    LongestPromptFirst,
    OutputLengthEstimator,
    RequestView,
    ShortestPromptFirst,
    ShortestRemainingTokensFirst,
    TierPolicy,
    make_policy,
    ranked_service,
)
from fairsched_plugin.policies.fcfs import FIFOPolicy
from fairsched_plugin.settings import AgingSPFConfig
from fairsched_plugin.policies.output_estimate import prompt_class


def view(rid, arrival, prompt, *, out=0, max_tokens=None, priority=0, computed=0):
    return RequestView(rid, arrival, prompt, computed_tokens=computed, output_tokens=out,
                       max_tokens=max_tokens, vllm_priority=priority)


def order(policy, views):
    return [v.request_id for v in sorted(views, key=policy.key)]


# ------------------------------------------------------------------ static keys


def test_every_configured_name_builds_its_policy():
    names = ("fcfs", "aging", "fifo", "tier", "spf", "lpf", "srtf", "aging-spf", "estf",
             "af-lcb")
    for name in names:
        assert make_policy(load_config({"fairsched": {"policy": name}}, environ={})).name == name


def test_fifo_is_arrival_order_whatever_the_size():
    views = [view("b", 2.0, 5), view("a", 1.0, 4000), view("c", 3.0, 1)]
    assert order(FIFOPolicy(), views) == ["a", "b", "c"]


def test_tier_then_arrival_lower_priority_number_first():
    views = [view("late-gold", 5.0, 10, priority=0), view("early-bronze", 1.0, 10, priority=2),
             view("silver", 3.0, 10, priority=1), view("early-gold", 2.0, 10, priority=0)]
    assert order(TierPolicy(), views) == ["early-gold", "late-gold", "silver", "early-bronze"]


def test_spf_and_lpf_are_mirror_orders_with_arrival_tiebreak():
    views = [view("mid", 1.0, 500), view("long", 2.0, 3000), view("short", 3.0, 20),
             view("short-early", 0.5, 20)]
    assert order(ShortestPromptFirst(), views) == ["short-early", "short", "mid", "long"]
    assert order(LongestPromptFirst(), views) == ["long", "mid", "short-early", "short"]


def test_ties_break_by_arrival_then_request_id():
    views = [view("b", 1.0, 50), view("a", 1.0, 50), view("c", 0.5, 50)]
    assert order(ShortestPromptFirst(), views) == ["c", "a", "b"]


def test_srtf_uses_remaining_target_output_and_ranks_unknown_last():
    views = [view("long-job", 1.0, 10, max_tokens=500, out=0),
             view("almost-done", 2.0, 10, max_tokens=500, out=490),
             view("short-job", 3.0, 10, max_tokens=50),
             view("no-cap", 0.0, 10, max_tokens=None)]
    assert order(ShortestRemainingTokensFirst(), views) == [
        "almost-done", "short-job", "long-job", "no-cap"]


def test_aging_spf_long_prompt_overtakes_after_its_prompt_gap_over_rate():
    policy = AgingShortestPromptFirst(AgingSPFConfig(rate=100.0), epoch=1000.0)
    long_ = view("long", 1000.0, 2100)
    # A 100-token prompt arriving within 20 s of the long one is still served first...
    assert order(policy, [long_, view("s", 1019.9, 100)]) == ["s", "long"]
    # ...one arriving later than (2100 - 100) / 100 = 20 s is not.
    assert order(policy, [long_, view("s", 1020.1, 100)]) == ["long", "s"]
    with pytest.raises(ValueError, match="aging_spf.rate"):
        make_policy(from_values({"policy": "aging-spf", "aging_spf": {"rate": 0.0}}))


# ------------------------------------------------------------------ estimators


def test_prompt_classes_follow_the_seed_thresholds():
    assert [prompt_class(n) for n in (1, 127, 128, 1024, 1025)] == [
        "short", "short", "medium", "medium", "long"]


def test_estf_cold_start_is_arrival_order_then_learns_per_class_means():
    estimator = OutputLengthEstimator(prior_output_tokens=128, min_samples=5)
    policy = EstimatedShortestTokensFirst(estimator)
    views = [view("long-prompt", 1.0, 2000), view("short-prompt", 2.0, 50),
             view("medium-prompt", 3.0, 500)]
    assert order(policy, views) == ["long-prompt", "short-prompt", "medium-prompt"]

    # Completions: short prompts answer at length ~N(300, 30), long ones ~N(40, 5),
    # medium ~N(120, 10).
    rng = random.Random(0)
    truth = {"short": (50, 300, 30), "medium": (500, 120, 10), "long": (2000, 40, 5)}
    for _ in range(400):
        for prompt, mean, sd in truth.values():
            policy.observe_finished(view("done", 0.0, prompt, out=max(1, round(rng.gauss(mean, sd)))))
    assert policy.refresh(now=10.0, kv_usage=0.0)
    for name, (_prompt, mean, sd) in truth.items():
        estimate = estimator.estimate(name)
        assert estimate.n == 400
        assert abs(estimate.mean - mean) < 0.25 * sd
        assert abs(estimate.std - sd) < 0.2 * sd
    assert order(policy, views) == ["long-prompt", "medium-prompt", "short-prompt"]
    # Progress counts: a short-prompt request 290 tokens in has ~10 left.
    nearly_done = view("nearly", 9.0, 50, out=290)
    assert order(policy, [*views, nearly_done])[0] == "nearly"


def test_estf_uses_the_global_mean_for_a_class_without_enough_samples():
    estimator = OutputLengthEstimator(prior_output_tokens=128, min_samples=3)
    for out in (10, 20, 30):
        estimator.observe(50, out)
    assert estimator.estimate("short").mean == 20
    assert estimator.estimate("long").mean == 20  # global, long has none yet
    assert OutputLengthEstimator(64, 3).estimate("medium").mean == 64  # prior


def test_estf_refresh_is_rate_limited_and_only_on_change():
    policy = EstimatedShortestTokensFirst(OutputLengthEstimator(128, 1))
    assert not policy.refresh(now=5.0, kv_usage=0.0)  # nothing new
    policy.observe_finished(view("x", 0.0, 50, out=10))
    assert policy.refresh(now=5.0, kv_usage=0.0)
    policy.observe_finished(view("y", 0.0, 50, out=30))
    assert not policy.refresh(now=5.1, kv_usage=0.0)  # within REFRESH_S
    assert policy.refresh(now=5.3, kv_usage=0.0)


# ------------------------------------------------------------------ AF-LCB


def _af_lcb(**overrides) -> AFLCBPolicy:
    config = AFLCBConfig(**overrides)
    return AFLCBPolicy(config, OutputLengthEstimator(128, 5), epoch=0.0)


def test_af_lcb_lower_bound_is_optimistic_with_few_samples_and_tightens():
    policy = _af_lcb(z=2.0)
    rng = random.Random(1)
    bounds = []
    for n in (5, 50, 500):
        while policy.estimator.overall.n < n:
            policy.observe_finished(view("d", 0.0, 50, out=max(1, round(rng.gauss(200, 50)))))
        estimate = policy.estimator.estimate("short")
        bounds.append(estimate.mean - policy.lcb(estimate))
    assert bounds[0] > bounds[1] > bounds[2] > 0


def test_af_lcb_never_starves_a_long_request_under_a_stream_of_short_ones():
    """One request is served at a time (smallest key first), each taking 0.05 s; short
    requests arrive every 0.04 s forever, so without aging the long one would never run."""
    policy = _af_lcb(age_rate=50.0)
    long_ = view("long", 0.0, 3000)
    bound = policy.overtake_bound(long_)
    queue = [long_]
    now, arrivals, served_at = 0.0, 0, None
    while served_at is None and now < 10 * bound:
        while arrivals * 0.04 <= now:
            queue.append(view(f"s{arrivals}", arrivals * 0.04, 20))
            arrivals += 1
        policy.refresh(now, kv_usage=0.0)
        first = min(queue, key=policy.key)
        queue.remove(first)
        if first is long_:
            served_at = now
        now += 0.05
    assert served_at is not None, "the long request starved"
    assert served_at <= bound + 0.05
    assert arrivals > 100  # shorts kept arriving the whole time


def test_af_lcb_tier_deficit_favours_the_tier_that_got_less_than_its_share():
    policy = _af_lcb(tier_weight=256.0)
    gold, bronze = view("gold", 1.0, 100, priority=0), view("bronze", 1.0, 100, priority=1)
    for tier in (0, 1):
        policy.observe_arrival(view("a", 0.0, 100, priority=tier))
    # Bronze got all the service although gold's weighted demand entitles it to 2/3.
    policy.observe_service(tier=1, tokens=5000)
    assert policy.refresh(now=1.0, kv_usage=0.0)
    assert order(policy, [bronze, gold]) == ["gold", "bronze"]
    policy.observe_service(tier=0, tokens=10**6)
    assert policy.refresh(now=2.0, kv_usage=0.0)
    assert order(policy, [gold, bronze]) == ["bronze", "gold"]


def test_af_lcb_kv_pressure_prefers_small_footprints_only_under_pressure():
    policy = _af_lcb(kv_threshold=0.8, kv_weight=1.0, prompt_weight=0.0)
    big_early = view("big", 1.0, 3000)
    small_late = view("small", 1.5, 100)
    policy.refresh(now=1.0, kv_usage=0.5)
    assert order(policy, [big_early, small_late]) == ["big", "small"]  # no pressure: age
    assert policy.refresh(now=2.0, kv_usage=0.99)
    assert order(policy, [big_early, small_late]) == ["small", "big"]


# ------------------------------------------------------------------ ranked service


def test_ranked_service_takes_the_top_k_across_running_and_waiting():
    policy = ShortestPromptFirst()
    running = [view("r100", 1.0, 100), view("r900", 2.0, 900), view("r50", 3.0, 50)]
    waiting = [view("w10", 4.0, 10), view("w200", 5.0, 200), view("w5000", 6.0, 5000)]
    step = ranked_service(policy, running, iter(waiting), max_batch_size=3)
    assert step.served_running == {"r50", "r100"}
    assert step.admissions == 1  # w10
    step = ranked_service(policy, running, iter(waiting), max_batch_size=5)
    assert step.served_running == {"r50", "r100", "r900"} and step.admissions == 2
    step = ranked_service(policy, running, iter(waiting), max_batch_size=10)
    assert step.admissions == 3
    step = ranked_service(policy, [], iter(waiting), max_batch_size=2)
    assert step.served_running == set() and step.admissions == 2


def test_ranked_service_reads_only_as_much_of_the_waiting_queue_as_needed():
    consumed = []

    def waiting():
        for i in range(1000):
            consumed.append(i)
            yield view(f"w{i}", 10.0 + i, 10)

    step = ranked_service(ShortestPromptFirst(), [view("r", 1.0, 5)], waiting(), 4)
    assert step.admissions == 3 and len(consumed) <= 4
