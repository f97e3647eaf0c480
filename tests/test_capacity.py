"""Stock's capacity: its completion rate when saturated, against a rate worked out by
hand; stable across windows of the production traces; checked against its definition
(the backlog stops growing below it and grows above it); a window too small is refused
with the smallest one that works."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fairsched_plugin.experiment.traces import read_trace, trace_case, window
from fairsched_plugin.sim.capacity import (
    COLLAPSE_LOAD,
    KEEPS_UP,
    SERVED,
    WindowTooSmall,
    backlog_check,
    find_capacity,
)
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.predictor.hardware import accelerator, model_config
from fairsched_plugin.sim.scenarios import SCENARIOS
from fairsched_plugin.sim.step_models import AnalyticStepModel, LinearStepModel
from fairsched_plugin.sim.suite import group_settings

from sim_cases import token_case

STEP = LinearStepModel(base_s=0.002, per_token_s=0.0001)


def test_the_saturated_rate_is_the_one_worked_out_by_hand() -> None:
    """Prompts of 64 tokens, one output token: saturated, every sync step runs four
    whole prefills in the 256-token budget, and each request completes with its prefill
    step. The oracle: ceil(SERVED * n / 4) steps of base + 256 per-token costs."""
    n = 400
    case = token_case([(0.01 * i, 64, 1) for i in range(n)])
    settings = SimSettings(max_num_batched_tokens=256, max_num_seqs=4, block_size=16)
    found = find_capacity(case, STEP, settings)
    count = math.ceil(SERVED * n)
    steps = math.ceil(count / 4)
    expected = count / (steps * (STEP.base_s + 256 * STEP.per_token_s))
    assert found.rate == pytest.approx(expected, rel=0.01)
    assert found.peak_running == 4


def test_the_backlog_stops_growing_below_capacity_and_grows_above_it() -> None:
    arrivals = np.cumsum(np.random.default_rng(0).exponential(0.01, 600))
    case = token_case([(float(a), 40 + (i * 37) % 300, 8 + i % 9)
                  for i, a in enumerate(arrivals)])
    settings = SimSettings(max_num_batched_tokens=256, max_num_seqs=32)
    found = find_capacity(case, STEP, settings)
    below = backlog_check(case, found.rate, 0.8, STEP, settings)
    above = backlog_check(case, found.rate, 1.25, STEP, settings)
    assert abs(below.backlog_growth) < 0.02
    assert below.completion_rate == pytest.approx(below.rate, rel=0.05)
    # Above capacity the backlog grows by the excess: 1 - 1/1.25 of the arrivals, and
    # stock completes about its capacity.
    assert above.backlog_growth == pytest.approx(1 - 1 / 1.25, abs=0.06)
    assert above.completion_rate == pytest.approx(found.rate, rel=0.08)


def test_a_window_stock_can_hold_at_once_is_refused_with_the_size_that_works() -> None:
    settings = SimSettings(max_num_batched_tokens=256, max_num_seqs=32)
    small = token_case([(0.01 * i, 8, 8) for i in range(20)])  # all admitted in one step
    with pytest.raises(WindowTooSmall, match=r"use at least about (\d+) requests") as info:
        find_capacity(small, STEP, settings)
    suggested = int(str(info.value).rsplit("about ", 1)[1].split()[0])
    big = token_case([(0.01 * i, 8, 8) for i in range(suggested)])
    assert find_capacity(big, STEP, settings).rate > 0


@pytest.mark.parametrize("trace", ["azure-conv", "azure-code"])
def test_capacity_on_a_production_trace_does_not_move_with_the_window(trace: str) -> None:
    """The windows where the rule that came before moved several-fold (1,000, 1,200 and
    1,500 requests from the start), on an H100 at vLLM's defaults."""
    model = AnalyticStepModel(model_config("qwen3-8b"), accelerator("h100"), "h100")
    settings = group_settings(SCENARIOS["azure-conv"], "h100", model, "async")
    rows = read_trace(trace)
    rates = [find_capacity(trace_case(window(rows, n), trace), model, settings).rate
             for n in (1000, 1200, 1500)]
    assert max(rates) / min(rates) <= 1.05, rates


def test_the_documented_capacity_command_prints_what_the_page_quotes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/simulator.md runs ``fairsched capacity ... --check`` on the conversation trace
    and quotes its output: run it for real and compare, line by line."""
    import shlex
    from pathlib import Path

    from fairsched_plugin.cli import main

    page = (Path(__file__).resolve().parent.parent / "docs" / "simulator.md").read_text()
    block, after = page.split("fairsched capacity --trace azure-conv", 1)[1].split("```", 1)
    argv = ["capacity", "--trace", "azure-conv",
            *shlex.split(block.replace("\\\n", " "))]
    output = after.strip("\n").split("\n\n", 1)[0]
    quoted = [line.strip() for line in output.splitlines()]
    assert quoted and "--check" in argv
    assert main(argv) == 0
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()
               if line.startswith("capacity:") or line.startswith("  at ")]
    assert printed == quoted


def test_where_saturation_collapses_capacity_is_the_rate_stock_keeps_up_with() -> None:
    """Short prompts, long outputs, a KV cache for 32 of the 128 sequences stock may run:
    queued all at once it preempts and recomputes, and completes fewer requests per second
    than it keeps up with when they arrive over time."""
    arrivals = np.cumsum(np.random.default_rng(0).exponential(0.01, 600))
    case = token_case([(float(a), 16, 64) for a in arrivals])
    settings = SimSettings(max_num_batched_tokens=256, max_num_seqs=128, kv_cache_tokens=4096)
    found = find_capacity(case, STEP, settings)
    assert found.collapsed
    assert found.rate >= COLLAPSE_LOAD * found.saturated_rate
    assert backlog_check(case, found.rate, 1.0, STEP, settings).backlog_growth <= KEEPS_UP
    assert backlog_check(case, found.rate, 1.1, STEP, settings).backlog_growth > KEEPS_UP
