"""No harm: the bounds the no-harm matrix checks (``sim.no_harm``), worked out by hand, and
the quick slice of the matrix CI runs: the Mooncake regression, where the default with
LPRS and APC on the built-in latency model was worse than stock on every figure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fairsched_plugin.policies.tail_watch import TailWatch
from fairsched_plugin.sim import no_harm
from fairsched_plugin.predictor.hardware import accelerator, model_config
from fairsched_plugin.sim.scenarios import SCENARIOS
from fairsched_plugin.sim.step_models import AnalyticStepModel
from fairsched_plugin.sim.suite import group_settings, run_cell

from sim_cases import REVISION_1_DEFAULT


def _metrics(p50: float = 1.0, p99: float = 10.0, e2e: float = 20.0, tpot: float = 0.05,
             tps: float = 1000.0, prefill: int = 100_000, long_p99: float = 12.0,
             hit: float | None = None) -> dict:
    metrics = {"ttft_p50": p50, "ttft_p99": p99, "e2e_mean": e2e, "tpot_p99": tpot,
               "output_tps": tps, "prefill_tokens": prefill,
               "by_class": {"short": {"n": 10, "p50": 0.1, "p99": 1.0},
                            "long": {"n": 10, "p50": 2.0, "p99": long_p99}}}
    if hit is not None:
        metrics["prefix_hit_rate"] = hit
    return metrics


def _results(default: dict, stock: dict, spf: dict | None = None,
             order: dict | None = None) -> dict:
    group = {"scenario": "s", "device": "h100", "model": "m", "mode": "async"}
    cells = [{**group, "load": 1.0, "arm": "stock", "metrics": stock},
             {**group, "load": 1.0, "arm": "guarded-srpf", "metrics": default}]
    if spf is not None:
        cells.append({**group, "load": 1.0, "arm": "spf", "metrics": spf})
    if order is not None:
        cells.append({**group, "load": 1.0, "arm": "order", "metrics": order})
    return {"plan": {"loads": [1.0]}, "groups": [group], "cells": cells,
            "meta": {"command": "fairsched suite", "vllm": "0.32.0", "commit": "x",
                     "default_policy": "guarded-srpf"}}


def test_a_cell_within_every_bound_gets_every_tick():
    results = _results(_metrics(p50=0.5, p99=10.2, long_p99=12.6, tps=990.0, prefill=101_000),
                       _metrics(), spf=_metrics(p50=0.3, p99=30.0))
    assert no_harm.failures(results, "guarded-srpf") == []
    table = "\n".join(no_harm.no_harm_table(results, "guarded-srpf"))
    assert "0.50 ✓" in table and "1.02 ✓" in table and "1.05 ✓" in table
    assert "0.30 / 3.00" in table  # spf beside
    assert "meets every bound in 1 of 1 cells" in table


def test_each_bound_is_crossed_just_past_its_limit():
    stock = _metrics(hit=0.40)
    cases = {
        "median TTFT": _metrics(p50=1.01, hit=0.40),
        "P99 TTFT": _metrics(p99=10.3, long_p99=12.0, hit=0.40),
        "worst class P99": _metrics(long_p99=12.7, hit=0.40),
        "mean E2E": _metrics(e2e=20.1, hit=0.40),
        "P99 TPOT": _metrics(tpot=0.0515, hit=0.40),
        "throughput": _metrics(tps=989.0, hit=0.40),
        "prefill computed": _metrics(prefill=101_100, hit=0.40),
        "hit rate - stock's": _metrics(hit=0.385),
    }
    for name, cell in cases.items():
        failed = no_harm.failures(_results(cell, stock), "guarded-srpf")
        assert [f[2] for f in failed] == [name], name


def test_a_figure_a_cell_did_not_measure_is_neither_ticked_nor_crossed():
    results = _results(_metrics(), _metrics())  # no hit rate: the prefix cache was off
    row = no_harm.no_harm_table(results, "guarded-srpf")[2]
    assert row.endswith("| - | - |")


def test_a_crossed_cell_is_shown_beside_the_other_arm_with_each_largest_excess():
    results = _results(_metrics(p50=1.04, p99=10.3), _metrics(),
                       order=_metrics(p50=0.5, p99=11.0))
    lines = no_harm.crossings_beside(results, "guarded-srpf", "order")
    assert lines[2] == ("| s · h100 · m · async | 1x | median TTFT, P99 TTFT | 1.04, 1.03 | "
                        "0.50, 1.10 | 0.040 / 0.080 |")
    assert lines[-1] == "`guarded-srpf` crosses further than `order` in 0 of these 1 cells."
    page = no_harm.render(results, "guarded-srpf", "order")
    assert "## Where `guarded-srpf` crosses, beside `order`" in page


def test_no_crossing_leaves_nothing_to_show_beside():
    results = _results(_metrics(), _metrics(), order=_metrics(p50=2.0))
    assert no_harm.crossings_beside(results, "guarded-srpf", "order") == []
    assert "## Where" not in no_harm.render(results, "guarded-srpf", "order")


def _watched_runs(scenario_name: str, requests: int, rate: float,
                  arms: tuple[str, ...]) -> dict[str, dict]:
    """Each arm's metrics on the scenario's first ``requests`` at ``rate`` (H100,
    Qwen3-8B, vLLM's H100 defaults, async); under ``"watch"``, the default's tail watch as
    the run left it."""
    scenario = SCENARIOS[scenario_name]
    model = AnalyticStepModel(model_config("qwen3-8b"), accelerator("h100"), "h100")
    settings = group_settings(scenario, "h100", model, "async")
    case = scenario.build(requests)
    watches: list[TailWatch] = []
    built = TailWatch.__init__

    def keep(watch: TailWatch, *args, **kwargs) -> None:
        built(watch, *args, **kwargs)
        watches.append(watch)

    runs: dict[str, dict] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TailWatch, "__init__", keep)
        for arm in arms:
            runs[arm] = run_cell(case, model, settings, arm, rate)
            if arm == "guarded-srpf":
                runs["watch"] = watches[-1]
    return runs


@pytest.fixture(scope="module")
def mooncake_regression() -> dict[str, dict]:
    """The Mooncake regression at a size CI runs: the trace's first 300 requests with the
    prefix cache off, at 1.07 req/s (stock's capacity on the first 1,500)."""
    return _watched_runs("mooncake-conv-nocache", 300, 1.07,
                         ("stock", "guarded-srpf", REVISION_1_DEFAULT))


@pytest.fixture(scope="module")
def long_context() -> dict[str, dict]:
    """Long-context traffic at a size CI runs: the scenario's first 400 requests at
    4.95 req/s (stock's capacity on the first 1,500)."""
    return _watched_runs("long-context", 400, 4.95, ("stock", "guarded-srpf"))


@pytest.mark.parametrize("runs", ["mooncake_regression", "long_context"])
def test_the_default_steps_back_and_then_meets_every_bound(
        runs: str, request: pytest.FixtureRequest):
    """Where reordering harms the tail, the watch finds it and goes back to arrival
    order; over the whole run the default then meets every bound against stock, each
    figure recomputed from the per-request records of both runs (``sim.no_harm``)."""
    runs = request.getfixturevalue(runs)
    assert runs["watch"].step_backs >= 1
    crossed = [(bound.name, value)
               for bound, value in no_harm.check({"metrics": runs["guarded-srpf"]},
                                                 {"metrics": runs["stock"]})
               if value is not None and not bound.holds(value)]
    assert not crossed


@pytest.mark.parametrize("metric", ["ttft_p50", "ttft_p99", "e2e_mean"])
def test_the_mooncake_regression_is_gone(mooncake_regression: dict[str, dict], metric: str):
    stock = mooncake_regression["stock"][metric]
    assert mooncake_regression["guarded-srpf"][metric] <= stock


def test_the_mooncake_slice_still_shows_the_regression_it_guards(
        mooncake_regression: dict[str, dict]):
    """The slice can fail: the previous default (LPRS and APC on the built-in model) is
    worse than stock on it."""
    stock, before = mooncake_regression["stock"], mooncake_regression[REVISION_1_DEFAULT]
    assert before["ttft_p99"] > stock["ttft_p99"] and before["e2e_mean"] > stock["e2e_mean"]
    assert before["prefill_tokens"] > stock["prefill_tokens"]


NO_HARM = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "2026-12-07-no-harm"


@pytest.mark.parametrize("folder", ["h100-traces", "h100-sharegpt", "h100-long-context",
                                    "h100-sessions", "a100-910b-conversation",
                                    "a100-910b-traces", "a100-sessions-sharegpt",
                                    "910b-sessions-sharegpt", "a100-910b-mooncake",
                                    "agent"])
def test_the_committed_no_harm_tables_render_from_their_results(tmp_path: Path, folder: str):
    from fairsched_plugin.cli import main

    shutil.copy(NO_HARM / folder / "results.json", tmp_path / "results.json")
    assert main(["suite", "--render", "--out", str(tmp_path)]) == 0
    for page in ("suite.md", "no-harm.md"):
        assert (tmp_path / page).read_text() == (NO_HARM / folder / page).read_text(), page


def test_a_committed_no_harm_cell_reproduces_exactly():
    """The default at 1.3x on the conversation trace: where its watch raised the gain."""
    results = json.loads((NO_HARM / "h100-traces" / "results.json").read_text())
    scenario = SCENARIOS["azure-conv"]
    model = AnalyticStepModel(model_config("qwen3-8b"), accelerator("h100"), "h100")
    settings = group_settings(scenario, "h100", model, "async")
    cell = next(c for c in results["cells"] if c["scenario"] == "azure-conv"
                and c["load"] == 1.3 and c["arm"] == results["meta"]["default_policy"])
    case = scenario.build(results["plan"]["num_requests"])
    assert run_cell(case, model, settings, cell["arm"], cell["rate"]) == cell["metrics"]
