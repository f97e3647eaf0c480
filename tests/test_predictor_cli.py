"""``fairsched train`` and ``fairsched eval-predictor`` on a synthetic profile file."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from fairsched_plugin.cli import main  # noqa: E402
from fairsched_plugin.predictor.features import FEATURE_NAMES  # noqa: E402
from fairsched_plugin.predictor.runtime import LatencyPredictor  # noqa: E402
from predictor_data import write_synthetic_profile  # noqa: E402

REPORT_FILES = ("metrics.json", "report.md", "scatter.png", "error_hist.png")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    profile = write_synthetic_profile(root / "profile.csv", 400)
    model = root / "model.onnx"
    code = main(["train", "--profile", str(profile), "--out", str(model), "--epochs", "8",
                 "--batch-size", "64", "--hidden-sizes", "32,16"])
    return code, profile, model


def test_train_exports_a_servable_model_and_a_report(trained, capsys):
    code, profile, model = trained
    assert code == 0
    predictor = LatencyPredictor.load(model, expected_memory_provider="kv_cache")
    training = predictor.metadata["training"]
    assert training["samples"]["read"] == 400
    assert training["config"]["hidden_sizes"] == [32, 16]
    assert training["profile_files"] == [str(profile)]
    ranges = predictor.metadata["feature_ranges"]
    assert list(ranges) == list(FEATURE_NAMES)
    # The synthetic profile's steps have up to 2 prefill chunks of 1-255 tokens, and every
    # memory state has 2048 MiB reserved.
    assert ranges["prefill_tokens"][0] == 0 and 255 <= ranges["prefill_tokens"][1] <= 510
    assert ranges["cuda_reserved_mb"] == [2048.0, 2048.0]
    report = model.with_name("model_report")
    for name in (*REPORT_FILES, "history.json"):
        assert (report / name).stat().st_size > 0
    metrics = json.loads((report / "metrics.json").read_text())["metrics"]
    assert metrics["samples"] == training["samples"]["test"]
    assert metrics["mae_ms"] == pytest.approx(training["test_metrics"]["mae_ms"], rel=1e-3)
    assert "| MAE | RMSE | MAPE | P50 | P90 | P95 | P99 | <= 5 ms | <= 10 ms |" in (
        report / "report.md").read_text()


def test_eval_predictor_writes_table_8(trained, tmp_path, capsys):
    _, _, model = trained
    other = write_synthetic_profile(tmp_path / "later.csv", 120, seed=5)
    out = tmp_path / "eval"
    assert main(["eval-predictor", "--model", str(model), "--profile", str(other),
                 "--out", str(out)]) == 0
    for name in REPORT_FILES:
        assert (out / name).stat().st_size > 0
    result = json.loads((out / "metrics.json").read_text())
    assert result["samples"]["read"] == 120
    assert result["metrics"]["samples"] == result["samples"]["evaluated"]
    assert "| MAE |" in capsys.readouterr().out


def test_eval_predictor_refuses_another_memory_provider(trained, tmp_path, capsys):
    _, _, model = trained
    other = write_synthetic_profile(tmp_path / "nvml.csv", 50, memory_provider="nvml")
    args = ["eval-predictor", "--model", str(model), "--profile", str(other),
            "--out", str(tmp_path / "eval")]
    assert main(args) == 2
    assert "trained on memory provider 'kv_cache'" in capsys.readouterr().err
    assert main([*args, "--allow-memory-mismatch"]) == 0


def test_train_reports_bad_input_without_a_traceback(tmp_path, capsys):
    missing = tmp_path / "absent.csv"
    assert main(["train", "--profile", str(missing), "--out", str(tmp_path / "m.onnx")]) == 2
    assert f"profile {missing}: no such file" in capsys.readouterr().err
    tiny = write_synthetic_profile(tmp_path / "tiny.csv", 5)
    assert main(["train", "--profile", str(tiny), "--out", str(tmp_path / "m.onnx")]) == 2
    assert "too few usable samples" in capsys.readouterr().err
