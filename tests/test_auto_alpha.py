"""The automatic Aging alpha: rate estimation and when alpha changes (pure)."""

from __future__ import annotations

import pytest

from fairsched_plugin.config import AUTO, ConfigError, from_values, load_config
from fairsched_plugin.policies import AgingPolicy, AutoAlpha, PrefillRateEstimator, make_policy
from fairsched_plugin.policies.base import RequestView


def test_rate_is_unknown_until_enough_prefill_steps():
    estimator = PrefillRateEstimator(min_steps=3)
    estimator.observe(0, 0.1)  # decode-only step: not counted
    estimator.observe(100, None)  # no measurement: not counted
    estimator.observe(100, 0.0)
    estimator.observe(200, 0.1)
    estimator.observe(200, 0.1)
    assert estimator.rate is None
    estimator.observe(200, 0.1)
    assert estimator.rate == pytest.approx(2000.0)


def test_rate_is_a_ratio_of_weighted_sums():
    estimator = PrefillRateEstimator(min_steps=1, half_life_steps=1.0)
    estimator.observe(100, 0.1)  # tokens 100, seconds 0.1
    estimator.observe(300, 0.1)  # tokens 100/2 + 300 = 350, seconds 0.05 + 0.1 = 0.15
    assert estimator.rate == pytest.approx(350 / 0.15)


def test_alpha_follows_the_rate_only_beyond_the_tolerance():
    auto = AutoAlpha(0.5, PrefillRateEstimator(min_steps=2, half_life_steps=1e9), tolerance=0.2)
    assert auto.observe(150, 0.1) is None  # not calibrated yet
    assert auto.alpha is None
    assert auto.observe(150, 0.1) == pytest.approx(0.5 * 1500)
    # 1,650 tokens/s overall after this step: alpha would be 825, within 20% of 750.
    assert auto.observe(195, 0.1) is None
    assert auto.alpha == pytest.approx(750)
    for _ in range(20):
        auto.observe(400, 0.1)
    # Overall 8,495 tokens in 2.3 s: 3,693 tokens/s, alpha near 1,847; it moved up in
    # steps of more than 20% and ends within 20% of the target.
    assert auto.alpha > 1000
    assert abs(auto.alpha - 0.5 * auto.estimator.rate) <= 0.2 * auto.alpha


def test_bad_factor_is_rejected():
    with pytest.raises(ValueError, match="auto_factor"):
        from_values({"aging": {"auto_factor": 0.0}})


def test_config_accepts_auto_and_makes_an_uncalibrated_policy():
    config = load_config(
        {"fairsched": {"policy": "aging", "aging": {"alpha": "Auto", "auto_factor": 0.25}}}, {})
    assert config.aging.alpha == AUTO and config.aging.auto_factor == 0.25
    policy = make_policy(config, epoch=1000.0)
    assert isinstance(policy, AgingPolicy) and policy.alpha is None
    # Uncalibrated: arrival order, whatever the prompt lengths, also for a burst whose
    # requests arrive a fraction of a millisecond apart (a large placeholder alpha
    # ordered those by prompt length).
    early_long = RequestView("a", 1000.5, 4000)
    late_short = RequestView("b", 1000.6, 10)
    burst_long = RequestView("c", 1000.7, 8000)
    burst_short = RequestView("d", 1000.7 + 1e-5, 5)
    keys = [policy.key(v) for v in (early_long, late_short, burst_long, burst_short)]
    assert keys == sorted(keys)
    assert "arrival order" in policy.describe()


@pytest.mark.parametrize("bad", [{"alpha": "autox"}, {"auto_factor": 0}, {"auto_factor": "auto"}])
def test_config_rejects_bad_auto_settings(bad):
    with pytest.raises(ConfigError, match="aging"):
        load_config({"fairsched": {"aging": bad}}, {})


def test_epoch_changes_no_order_but_keeps_precision():
    """With alpha = 1e6 and wall-clock arrivals (~1.7e9 s), the remaining-work term would
    vanish in rounding without the epoch; relative to it, it still breaks ties."""
    now = 1.7e9
    policy = AgingPolicy(alpha=1e6, beta=-1.0, epoch=now)
    same_time_long = RequestView("a", now + 1.0, 3000)
    same_time_short = RequestView("b", now + 1.0, 10)
    assert policy.value(same_time_short) < policy.value(same_time_long)
    assert policy.value(same_time_long) - policy.value(same_time_short) == pytest.approx(2990)
