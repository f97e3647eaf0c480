"""The chunked-prefill paper's head-of-line case on a fresh scheduler (``sim.head_of_line``): a long
prompt arrives first at an empty queue with short ones right behind it, in vLLM's own scheduler
with fake outputs. From the very first step the guard's order must serve the short ones in
at most half the steps they wait under stock vLLM; the default, whose tail watch starts in
arrival order, serves them as stock does until it has judged its first requests."""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("vllm")

from fairsched_plugin.config import FairschedConfig  # noqa: E402
from fairsched_plugin.sim.head_of_line import Case, short_delays  # noqa: E402

CASES = [Case(), Case(short_after_steps=1)]
DEFAULT = FairschedConfig().policy


@pytest.mark.parametrize("case", CASES, ids=["queued-together", "long-running-first"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_the_guards_order_lets_short_prompts_pass_a_long_one_from_the_first_step(
        config_only_model, case, async_scheduling):
    stock = statistics.mean(short_delays("stock", case, config_only_model, async_scheduling))
    guarded = statistics.mean(short_delays(f"{DEFAULT}:tail_window=0:overtake_running=true", case,
                                           config_only_model, async_scheduling))
    assert stock >= 4  # the long prompt's 3,000 tokens take six 512-token steps
    assert guarded <= stock / 2


@pytest.mark.parametrize("case", CASES, ids=["queued-together", "long-running-first"])
def test_the_default_starts_in_arrival_order_as_stock(config_only_model, case):
    assert (short_delays(DEFAULT, case, config_only_model)
            == short_delays("stock", case, config_only_model))


@pytest.mark.parametrize("arm", ["aging:alpha=37.5", "guarded-srpf:tail_window=0:overtake_running=true", "hrrn"])
def test_every_size_aware_order_passes_the_long_prompt(config_only_model, arm):
    """The paper's Aging with its own alpha, and the documented alternatives."""
    stock = statistics.mean(short_delays("stock", Case(), config_only_model))
    assert statistics.mean(short_delays(arm, Case(), config_only_model)) <= stock / 2


def test_without_the_size_allowance_the_guard_keeps_the_long_prompt_first(config_only_model):
    """The guard alone makes a request that finds an empty queue overdue at once: exactly
    stock's delay (why the default carries the allowance)."""
    stock = short_delays("stock", Case(), config_only_model)
    assert short_delays("guarded-srpf:size_allowance=0:lprs.enabled=false:apc.enabled=false", Case(),
                        config_only_model) == stock
