"""The simulator on vLLM's real scheduler: determinism, exact tokens, the virtual clock,
hand-computed FCFS waits, stock = fcfs, and a policy that visibly reorders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.experiment.metrics import summarize_run
from fairsched_plugin.experiment.case_files import WorkloadRequest
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.engine import simulate
from fairsched_plugin.sim.engine_settings import SimSettings, SimulationStalled
from fairsched_plugin.sim.step_models import LinearStepModel, parse_step_model


def _case(specs: list[tuple[float, int, int]]) -> list[WorkloadRequest]:
    """(arrival s, prompt tokens, output tokens) -> a case, ids in arrival order."""
    return [WorkloadRequest(id=f"r{i:03d}", arrival_s=a, prompt="x", prompt_tokens=p,
                            output_tokens=o, tier=0, category="test",
                            request_class="short" if p < 128 else "medium")
            for i, (a, p, o) in enumerate(specs)]


def _mixed_case(n: int = 60) -> list[WorkloadRequest]:
    """Long and short prompts arriving faster than a 64-token budget serves them."""
    return _case([(0.004 * i, 300 if i % 5 == 0 else 12 + (i * 7) % 40, 5 + (i * 3) % 17)
                  for i in range(n)])


SMALL = SimSettings(max_num_batched_tokens=64, max_num_seqs=16, block_size=16,
                    kv_cache_tokens=1 << 16)
STEP = LinearStepModel(base_s=0.002, per_token_s=0.0001)


def _run(arm: str, case, tmp_path: Path, settings: SimSettings = SMALL, model=STEP):
    trace = tmp_path / f"{arm.replace(':', '_')}-trace.jsonl"
    return simulate(RunSpec(parse_arm(arm), case, model, settings), trace_path=trace)


def test_same_input_same_result(tmp_path: Path) -> None:
    case = _mixed_case()
    first = _run("guarded-srpf", case, tmp_path / "a")
    second = _run("guarded-srpf", case, tmp_path / "b")
    assert first.run["requests"] == second.run["requests"]
    assert first.run["trace"] == second.run["trace"]
    assert first.virtual_s == second.virtual_s


@pytest.mark.parametrize("arm", ["stock", "fcfs", "aging:alpha=5", "guarded-srpf"])
def test_every_request_gets_exactly_its_tokens(arm: str, tmp_path: Path) -> None:
    case = _mixed_case()
    rows = _run(arm, case, tmp_path).run["requests"]
    assert len(rows) == len(case)
    for row, request in zip(rows, case):
        assert row["output_tokens"] == request.output_tokens
        assert row["arrival_s"] <= row["first_token_s"] <= row["finish_s"]
        assert row["admitted_s"] is not None and row["admitted_s"] <= row["first_token_s"]
        # The adapter's trace counts a final one-token prefill chunk as a decode
        # (has_prefill_work), so such a request has no prefill_done_s.
        if row["prefill_done_s"] is not None:
            assert row["prefill_done_s"] <= row["first_token_s"]


def test_fcfs_waits_match_a_hand_computed_single_queue(tmp_path: Path) -> None:
    """One slot, 10 ms per step whatever it holds, 3 output tokens each: request k (all
    arrive at 0) takes steps 3k+1..3k+3, so its first token is at (3k+1) x 10 ms and it
    finishes at (3k+3) x 10 ms. A late arrival after an idle gap starts at its arrival."""
    one_slot = SimSettings(max_num_batched_tokens=256, max_num_seqs=1, kv_cache_tokens=4096)
    case = _case([(0.0, 32, 3)] * 4 + [(1.0, 32, 3)])
    case = [WorkloadRequest(**{**r.__dict__, "id": f"r{i}"}) for i, r in enumerate(case)]
    for arm in ("stock", "fcfs"):
        rows = _run(arm, case, tmp_path, one_slot, LinearStepModel(0.010, 0.0)).run["requests"]
        for k, row in enumerate(rows[:4]):
            assert row["first_token_s"] == pytest.approx((3 * k + 1) * 0.010)
            assert row["finish_s"] == pytest.approx((3 * k + 3) * 0.010)
        assert rows[4]["first_token_s"] == pytest.approx(1.010)
        assert rows[4]["finish_s"] == pytest.approx(1.030)


def test_step_time_is_what_the_model_says(tmp_path: Path) -> None:
    """One request alone: a 100-token prefill at 1 ms/token, then 1-token decodes."""
    case = _case([(0.5, 100, 4)])
    result = _run("fcfs", case, tmp_path, SimSettings(max_num_batched_tokens=256),
                  LinearStepModel(0.0, 0.001))
    row = result.run["requests"][0]
    assert row["first_token_s"] == pytest.approx(0.5 + 0.100)
    assert row["finish_s"] == pytest.approx(0.5 + 0.100 + 3 * 0.001)
    times = [step["step_time_s"] for step in result.run["trace"]]
    assert times == pytest.approx([0.100, 0.001, 0.001, 0.001])


def test_the_plugin_reads_the_virtual_clock(tmp_path: Path) -> None:
    """Trace times are virtual seconds (a wall clock would read ~1.7e9), and consecutive
    steps are exactly one modelled step apart."""
    trace = _run("guarded-srpf", _mixed_case(), tmp_path).run["trace"]
    assert trace[0]["t"] == pytest.approx(0.0)
    for before, after in zip(trace, trace[1:]):
        assert before["t_done"] == pytest.approx(before["t"] + before["step_time_s"])
        assert after["t"] >= before["t_done"] - 1e-12
    assert trace[-1]["t_done"] < 100.0


def test_fcfs_schedules_exactly_like_stock(tmp_path: Path) -> None:
    case = _mixed_case(80)
    stock = _run("stock", case, tmp_path)
    fcfs = _run("fcfs", case, tmp_path)
    assert stock.run["requests"] == fcfs.run["requests"]
    keys = ("t", "num_decodes", "num_prefills", "prefill_chunks", "admitted", "prefill_done")
    assert ([{k: s[k] for k in keys} for s in stock.run["trace"]]
            == [{k: s[k] for k in keys} for s in fcfs.run["trace"]])


def test_a_policy_arm_reaches_the_scheduler(tmp_path: Path) -> None:
    """Aging with a small alpha is shortest-prompt-first: the median TTFT of a queue of
    mixed prompts falls below FCFS's (if the arm's config were lost it would equal it)."""
    case = _mixed_case(80)
    fcfs = summarize_run(_run("fcfs", case, tmp_path).run["requests"])
    aging = summarize_run(_run("aging:alpha=1", case, tmp_path).run["requests"])
    assert aging["latency"]["ttft_s"]["p50"] < 0.8 * fcfs["latency"]["ttft_s"]["p50"]


def test_a_run_past_its_bound_stops_and_names_requests(tmp_path: Path) -> None:
    bounded = SimSettings(max_num_batched_tokens=64, max_num_seqs=16, max_virtual_s=0.05)
    with pytest.raises(SimulationStalled, match="r0"):
        _run("fcfs", _mixed_case(), tmp_path, bounded)


def test_simulate_command_writes_the_bench_report(tmp_path: Path) -> None:
    from fairsched_plugin.cli import main

    case_path = tmp_path / "case.jsonl"
    case_path.write_text("".join(r.to_json() + "\n" for r in _mixed_case(40)))
    out = tmp_path / "out"
    assert main(["simulate", "--arms", "stock,aging:alpha=1", "--case", str(case_path),
                 "--step-model", "linear:2:0.1", "--max-num-batched-tokens", "64",
                 "--max-num-seqs", "16",
                 "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["arms"]) == {"stock", "aging:alpha=1"}
    assert report["config"]["simulated"] is True
    assert "## 1. Main comparison" in (out / "report.md").read_text()
    assert main(["simulate", "--case", str(case_path), "--step-model", "analytic:tpu9:qwen3-8b",
                 "--out", str(out)]) == 2


def test_a_request_longer_than_the_model_fails_like_the_server(tmp_path: Path) -> None:
    case = _case([(0.0, 100, 10), (0.0, 4000, 200)])
    rows = _run("fcfs", case, tmp_path, SimSettings(max_model_len=4096)).run["requests"]
    assert rows[0]["error"] is None and rows[0]["output_tokens"] == 10
    assert rows[1]["error"] == "prompt + output tokens exceed max_model_len"
    assert rows[1]["first_token_s"] is None


def test_surrogate_predictor_reproduces_a_linear_step_model(tmp_path: Path) -> None:
    """LPRS's stand-in predictor, fitted to a step model that is itself linear in the
    features, predicts it (to float32 precision) through ONNX Runtime."""
    import numpy as np

    from fairsched_plugin.predictor.features import MemoryState, batch_row
    from fairsched_plugin.predictor.runtime import LatencyPredictor
    from fairsched_plugin.sim import surrogate

    model = LinearStepModel(0.004, 0.0001, 0.0003)
    batches = surrogate.sample_batches(300, 512, 32, 1024, np.random.default_rng(1))
    weights, mape, _ = surrogate.fit(model, batches)
    assert mape < 1e-6
    path = surrogate.write(tmp_path / "s.onnx", weights, model.description, {"samples": 300})
    predictor = LatencyPredictor.load(path, expected_memory_provider="kv_cache")
    memory = MemoryState(1.0, 2.0, 1.0, 3.0)
    rows = np.stack([batch_row(b.stats(), memory) for b in batches[:20]])
    expected = [model.step_time_s(b, memory) * 1e3 for b in batches[:20]]
    assert predictor.predict(rows) == pytest.approx(expected, rel=1e-4)


def test_surrogate_batches_stay_within_a_context_shorter_than_the_budget() -> None:
    import numpy as np

    from fairsched_plugin.sim import surrogate

    batches = surrogate.sample_batches(200, 8192, 64, 1024, np.random.default_rng(0))
    assert all(chunk + before <= 1024 for b in batches for chunk, before in b.prefills)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        surrogate.sample_batches(10, 512, 8, 0, np.random.default_rng(0))


def test_lprs_predictor_command_writes_a_model_lprs_loads(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """``fairsched lprs-predictor``: LPRS's latency model from a config.json and a device
    preset, no profiling run; it loads as the scheduler loads it, small batches predicted
    within 30% of the analytic time; a bad device is a clear error, not a traceback."""
    import json

    import numpy as np

    from fairsched_plugin.cli import main
    from fairsched_plugin.predictor.features import MemoryState, batch_row
    from fairsched_plugin.predictor.runtime import LatencyPredictor
    from fairsched_plugin.predictor.batch import SimBatch
    from fairsched_plugin.predictor.hardware import MODEL_CONFIGS
    from fairsched_plugin.sim.step_models import parse_step_model

    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(MODEL_CONFIGS["qwen3-8b"]))
    out = tmp_path / "lprs.onnx"
    args = ["lprs-predictor", "--device", "h100", "--model", str(config.parent),
            "--max-num-batched-tokens", "8192", "--max-num-seqs", "256",
            "--max-model-len", "16384", "--out", str(out)]
    assert main(args) == 0
    assert "MAPE" in capsys.readouterr().out
    predictor = LatencyPredictor.load(out, expected_memory_provider="kv_cache")
    step = parse_step_model(f"analytic:h100:{config}")
    memory = MemoryState(0.0, 0.0, 0.0, 0.0)
    for batch in (SimBatch(decodes=[(500, 1)]), SimBatch(prefills=[(64, 0)]),
                  SimBatch(decodes=[(1000, 1)] * 8, prefills=[(512, 0)])):
        predicted = predictor.predict(np.stack([batch_row(batch.stats(), memory)]))[0]
        assert predicted == pytest.approx(step.step_time_s(batch, memory) * 1e3, rel=0.3)
    assert main(args[:2] + ["h1000"] + args[3:]) == 2
    assert "unknown accelerator 'h1000'" in capsys.readouterr().err
