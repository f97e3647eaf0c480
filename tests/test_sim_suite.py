"""The simulator where users run: long contexts, async scheduling, vLLM's
own serve defaults per device, the presets against published figures, and the committed
suite results, rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.sim import published
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.clock import VirtualClock
from fairsched_plugin.sim.devices import serve_defaults
from fairsched_plugin.sim.engine import TOO_LONG, simulate
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.sim.scheduler_factory import make_arm_scheduler
from fairsched_plugin.sim.step_models import LinearStepModel, parse_step_model

from sim_cases import as_committed, committed_metrics, token_case

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / (
    "2026-12-06-suite-quick")
STEP = LinearStepModel(base_s=0.002, per_token_s=0.0001)


def test_a_prompt_up_to_max_model_len_simulates_and_a_longer_one_is_rejected() -> None:
    settings = SimSettings(max_num_batched_tokens=8192, max_num_seqs=64,
                           max_model_len=131_072, kv_cache_tokens=400_000)
    case = token_case([(0.0, 120_000, 4), (0.01, 100, 4), (0.02, 140_000, 4), (0.03, 33_000, 4)])
    run = simulate(RunSpec(parse_arm("stock"), case, STEP, settings)).run
    errors = {r["id"]: r["error"] for r in run["requests"]}
    assert errors == {"r0000": None, "r0001": None, "r0002": TOO_LONG, "r0003": None}
    assert all(r["output_tokens"] == 4 for r in run["requests"] if r["error"] is None)


@pytest.mark.parametrize("arm", ["stock", "guarded-aging"])
def test_async_scheduling_runs_vllms_async_classes(arm: str) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    settings = SimSettings(async_scheduling=True)
    scheduler = make_arm_scheduler(parse_arm(arm), settings, VirtualClock(), None)
    try:
        assert isinstance(scheduler, AsyncScheduler)
        assert scheduler.scheduler_config.async_scheduling
    finally:
        scheduler.shutdown()


def test_async_outputs_arrive_a_step_late_for_a_request_that_lands_mid_step() -> None:
    """B arrives while A's prefill step runs. Sync: B joins the next step, scheduled when
    that one ends. Async: the next step was scheduled when A's began, before B arrived, so
    B joins the one after."""
    case = token_case([(0.0, 40, 30), (0.001, 10, 3)])
    settings = SimSettings(max_num_batched_tokens=64, max_num_seqs=16)
    ttft = {}
    for mode in (False, True):
        run = simulate(RunSpec(parse_arm("stock"), case, STEP,
                               SimSettings(**{**settings.__dict__, "async_scheduling": mode}))).run
        row = next(r for r in run["requests"] if r["id"] == "r0001")
        ttft[mode] = row["first_token_s"] - row["arrival_s"]
        assert all(r["output_tokens"] == r["target_output_tokens"] for r in run["requests"])
    a_decode_alone = STEP.base_s + STEP.per_token_s
    assert ttft[True] == pytest.approx(ttft[False] + a_decode_alone)


def test_serve_defaults_come_from_the_installed_vllm() -> None:
    h100, a100, npu = (serve_defaults(d) for d in ("h100", "a100-80gb", "ascend910b"))
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    assert (npu.max_num_batched_tokens, npu.max_num_seqs, npu.block_size) == (2048, 256, 128)


def test_the_presets_are_within_ten_percent_of_every_published_figure() -> None:
    for name in dict.fromkeys(p.accelerator for p in published.PUBLISHED):
        for point, error in published.errors(name):
            assert abs(error) < 0.10, (point, error)


def test_the_calibrated_h100_decodes_like_the_published_batch_of_one() -> None:
    model = parse_step_model("analytic:h100:llama-3-8b")
    from fairsched_plugin.predictor.batch import SimBatch

    assert model.step_time_s(SimBatch(decodes=[(256, 1)]), None) * 1e3 == pytest.approx(
        6.45, rel=0.05)


def _committed() -> dict:
    return json.loads((RESULTS / "results.json").read_text())


def test_a_committed_suite_cell_reproduces_exactly() -> None:
    """The figures the docs quote come from this file; rerunning one cell (the default at
    1.1x capacity, azure-conv on H100, async) must give them again."""
    from fairsched_plugin.predictor.hardware import accelerator, model_config
    from fairsched_plugin.sim.scenarios import SCENARIOS
    from fairsched_plugin.sim.step_models import AnalyticStepModel
    from fairsched_plugin.sim.suite import group_settings, run_cell

    results = _committed()
    key = ("azure-conv", "h100", "qwen3-8b", "async")
    scenario = SCENARIOS[key[0]]
    case = scenario.build(results["plan"]["num_requests"])
    model = AnalyticStepModel(model_config(key[2]), accelerator(key[1]), key[1])
    settings = group_settings(scenario, key[1], model, key[3])
    group = next(g for g in results["groups"]
                 if (g["scenario"], g["device"], g["model"], g["mode"]) == key)
    assert group["engine"] == settings.__dict__
    arm = results["meta"]["default_policy"]  # stock runs the same simulator
    cell = next(c for c in results["cells"]
                if (c["scenario"], c["device"], c["model"], c["mode"]) == key
                and c["load"] == 1.1 and c["arm"] == arm)
    metrics = run_cell(case, model, settings, as_committed(results, arm), cell["rate"])
    assert committed_metrics(metrics, cell["metrics"]) == cell["metrics"]


def test_the_committed_table_is_rendered_from_the_committed_results(tmp_path: Path) -> None:
    from fairsched_plugin.cli import main

    shutil.copy(RESULTS / "results.json", tmp_path / "results.json")
    assert main(["suite", "--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "suite.md").read_text() == (RESULTS / "suite.md").read_text()
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        p.name for p in (RESULTS / "plots").iterdir()}


def test_capacity_and_simulate_take_a_trace(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from fairsched_plugin.cli import main

    trace = tmp_path / "log.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{0.05 * i:.2f},{40 + (i * 37) % 300},{8 + i % 9}\n" for i in range(120)))
    engine = ["--trace", str(trace), "--step-model", "linear:2:0.1",
              "--max-num-batched-tokens", "256", "--max-num-seqs", "32"]
    assert main(["capacity", *engine, "--out", str(tmp_path / "cap.json")]) == 0
    capacity = json.loads((tmp_path / "cap.json").read_text())["capacity_rps"]
    assert f"capacity: {capacity:.2f} req/s" in capsys.readouterr().out
    assert main(["simulate", *engine, "--arms", "stock,guarded-aging", "--async-scheduling",
                 "--trace-rate", f"{capacity:.3f}", "--no-trace", "--out",
                 str(tmp_path / "sim")]) == 0
    config = json.loads((tmp_path / "sim" / "config.json").read_text())
    assert config["engine"]["async_scheduling"] is True
    assert config["workload"] == f"trace {trace}"
    # Without preemption or a prefix cache, every arm computes each prompt token once.
    prompts = sum(40 + (i * 37) % 300 for i in range(120))
    assert {arm: work["prefill_tokens"] for arm, work in config["prefill_work"].items()} == {
        "stock": prompts, "guarded-aging": prompts}
    assert "| stock | " + f"{prompts:,} | 1.000 | 0.0% |" in capsys.readouterr().out


PREFIX_RESULTS = RESULTS.parent / "2026-12-06-prefix-cache"


@pytest.mark.parametrize("folder", ["chat", "mooncake"])
def test_the_committed_prefix_cache_tables_render_from_their_results(
        folder: str, tmp_path: Path) -> None:
    from fairsched_plugin.cli import main

    shutil.copy(PREFIX_RESULTS / folder / "results.json", tmp_path / "results.json")
    assert main(["suite", "--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "suite.md").read_text() == (
        PREFIX_RESULTS / folder / "suite.md").read_text()


def test_a_committed_open_loop_conversation_cell_reproduces_exactly() -> None:
    """The default at 1.3x on chat-sessions-open: the cell where the order matters, its
    prefix cache on and its hit rate among the figures."""
    from fairsched_plugin.predictor.hardware import accelerator, model_config
    from fairsched_plugin.sim.scenarios import SCENARIOS
    from fairsched_plugin.sim.step_models import AnalyticStepModel
    from fairsched_plugin.sim.suite import group_settings, run_cell

    results = json.loads((PREFIX_RESULTS / "chat" / "results.json").read_text())
    key = ("chat-sessions-open", "h100", "qwen3-8b", "async")
    scenario = SCENARIOS[key[0]]
    model = AnalyticStepModel(model_config(key[2]), accelerator(key[1]), key[1])
    settings = group_settings(scenario, key[1], model, key[3])
    cell = next(c for c in results["cells"]
                if (c["scenario"], c["device"], c["model"], c["mode"]) == key
                and c["load"] == 1.3 and c["arm"] == results["meta"]["default_policy"])
    case = scenario.build(results["plan"]["num_requests"])
    metrics = run_cell(case, model, settings, as_committed(results, cell["arm"]),
                       cell["rate"], scenario.closed_loop)
    assert committed_metrics(metrics, cell["metrics"]) == cell["metrics"]


FLEETS = RESULTS.parent / "2026-12-07-fleets"


@pytest.mark.parametrize("folder", ["azure-conv", "azure-conv-8", "long-context",
                                    "long-context-8", "long-context-8-dp-rr", "disagg"])
def test_the_committed_fleet_tables_render_from_their_results(tmp_path: Path,
                                                              folder: str) -> None:
    from fairsched_plugin.cli import main

    results = FLEETS / folder
    shutil.copy(results / "results.json", tmp_path / "results.json")
    assert main(["suite", "--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "suite.md").read_text() == (results / "suite.md").read_text()



def test_a_committed_disaggregated_cell_reproduces_exactly() -> None:
    """The default at capacity on one prefill and one decode engine: the cell where the
    order already matters there, hand-off figures included."""
    from fairsched_plugin.predictor.hardware import accelerator, model_config
    from fairsched_plugin.sim.scenarios import SCENARIOS
    from fairsched_plugin.sim.step_models import AnalyticStepModel
    from fairsched_plugin.sim.suite import group_settings, run_cell

    results = json.loads((FLEETS / "disagg" / "results.json").read_text())
    key = ("azure-conv", "h100", "qwen3-8b", "async")
    scenario = SCENARIOS[key[0]]
    model = AnalyticStepModel(model_config(key[2]), accelerator(key[1]), key[1])
    settings = group_settings(scenario, key[1], model, key[3])
    cell = next(c for c in results["cells"] if c.get("fleet") == "1p1d" and c["load"] == 1.0
                and c["arm"] == results["meta"]["default_policy"])
    case = scenario.build(results["plan"]["num_requests"])
    metrics = run_cell(case, model, settings, as_committed(results, cell["arm"]),
                       cell["rate"], fleet="1p1d",
                       kv_bandwidth_gb_s=results["plan"]["kv_bandwidth_gb_s"])
    assert committed_metrics(metrics, cell["metrics"]) == cell["metrics"]
