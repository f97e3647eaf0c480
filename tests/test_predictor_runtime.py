"""ONNX export and serving with real ONNX Runtime sessions and real files.

CUDA and CANN cannot run here: the fallback tests ask for them (really absent) or make
``onnxruntime.get_available_providers`` claim CANN exists (a fake) to check that what
actually runs is what gets reported.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from fairsched_plugin.config import PredictorConfig  # noqa: E402
from fairsched_plugin.predictor.dataset import DatasetConfig, prepare  # noqa: E402
from fairsched_plugin.predictor.export import export_onnx, model_metadata  # noqa: E402
from fairsched_plugin.predictor.features import FEATURE_NAMES, feature_ranges  # noqa: E402
from fairsched_plugin.predictor.model_format import FORMAT_VERSION, METADATA_KEY  # noqa: E402
from fairsched_plugin.predictor.runtime import (  # noqa: E402
    LatencyPredictor,
    PredictorError,
    padded_batch,
)
from fairsched_plugin.predictor.train import TrainConfig, predict, train_model  # noqa: E402
from predictor_data import synthetic_steps  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A few-epoch model, its export, and test rows."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    data = prepare(*synthetic_steps(300), DatasetConfig())
    result = train_model(data.train, data.val, TrainConfig(epochs=5, batch_size=64))
    torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("model") / "latency.onnx"
    metadata = model_metadata(memory_provider="kv_cache", vllm_version="0.32.0",
                              hardware="test CPU", training={"test_metrics": {"mae_ms": 1.0}})
    export_onnx(result.model, path, metadata)
    return result.model, path, data.test.features


def _rewrite_metadata(source: Path, target: Path, change) -> Path:
    proto = onnx.load(str(source))
    entry = next(e for e in proto.metadata_props if e.key == METADATA_KEY)
    metadata = json.loads(entry.value)
    change(metadata)
    entry.value = json.dumps(metadata)
    onnx.save(proto, str(target))
    return target


def test_onnx_matches_torch_for_any_batch_size(trained):
    model, path, rows = trained
    predictor = LatencyPredictor.load(path)
    assert predictor.provider == "CPUExecutionProvider"
    for n in (1, 7, len(rows)):
        served = predictor.predict(rows[:n])
        assert served.shape == (n,)
        np.testing.assert_allclose(served, predict(model, rows[:n]), rtol=1e-5, atol=1e-4)


def test_export_records_the_metadata(trained):
    _, path, _ = trained
    predictor = LatencyPredictor.load(path)
    meta = predictor.metadata
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["feature_names"] == list(FEATURE_NAMES)
    assert meta["feature_units"]["prefill_interaction"] == "tokens^2"
    assert (meta["memory_provider"], meta["vllm_version"], meta["hardware"]) == (
        "kv_cache", "0.32.0", "test CPU")
    assert meta["training"]["test_metrics"]["mae_ms"] == 1.0
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["features"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_from_config_checks_the_memory_provider(trained):
    _, path, rows = trained
    predictor = LatencyPredictor.from_config(PredictorConfig(path=str(path)), "kv_cache")
    assert predictor.predict(rows[:2]).shape == (2,)
    with pytest.raises(PredictorError, match="trained on memory provider 'kv_cache'.*'torch'"):
        LatencyPredictor.from_config(PredictorConfig(path=str(path)), "torch")
    with pytest.raises(PredictorError, match="predictor.path is empty"):
        LatencyPredictor.from_config(PredictorConfig(), "kv_cache")


def test_memory_mismatch_can_be_allowed_with_a_warning(trained, caplog):
    _, path, _ = trained
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        LatencyPredictor.load(path, expected_memory_provider="nvml", allow_memory_mismatch=True)
    assert "trained on memory provider 'kv_cache' and is served with 'nvml'" in caplog.text


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="this ONNX Runtime has CUDA: nothing to fall back from")
def test_missing_provider_falls_back_to_cpu_with_a_warning(trained, caplog):
    _, path, rows = trained
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        predictor = LatencyPredictor.load(path, provider="cuda", device_id=1)
    assert predictor.provider == "CPUExecutionProvider"
    assert "has no CUDAExecutionProvider" in caplog.text
    assert predictor.predict(rows[:3]).shape == (3,)


@pytest.mark.filterwarnings("ignore:Specified provider 'CANNExecutionProvider'")
def test_provider_that_does_not_start_is_reported(trained, caplog, monkeypatch):
    _, path, rows = trained
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CANNExecutionProvider", "CPUExecutionProvider"])
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        predictor = LatencyPredictor.load(path, provider="cann")
    assert predictor.provider == "CPUExecutionProvider"
    assert "did not start CANNExecutionProvider" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"provider": "npu"}, "unknown predictor provider 'npu'; use one of cpu, cuda, cann"),
        ({"device_id": -1}, "device_id must be an integer >= 0"),
        ({"threads": 0}, "threads must be an integer >= 1"),
        ({"provider": "cuda", "provider_options": {"gpu_memlimit": "1"}},
         "unknown option.* gpu_memlimit; accepted: .*gpu_mem_limit"),
        ({"provider_options": {"device_id": "0"}}, "'cpu': unknown option.*accepted: none"),
    ],
)
def test_provider_settings_are_validated(trained, kwargs, message):
    _, path, _ = trained
    with pytest.raises(PredictorError, match=message):
        LatencyPredictor.load(path, **kwargs)


def test_missing_and_corrupt_files_are_clear_errors(tmp_path):
    with pytest.raises(PredictorError, match=f"latency model {tmp_path}/absent.onnx: no such"):
        LatencyPredictor.load(tmp_path / "absent.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 50)
    with pytest.raises(PredictorError, match="corrupt.onnx: not a loadable ONNX model"):
        LatencyPredictor.load(corrupt)


def test_model_without_fairsched_metadata_is_refused(trained, tmp_path):
    _, path, _ = trained
    proto = onnx.load(str(path))
    del proto.metadata_props[:]
    onnx.save(proto, str(tmp_path / "bare.onnx"))
    with pytest.raises(PredictorError, match="bare.onnx: no 'fairsched' metadata"):
        LatencyPredictor.load(tmp_path / "bare.onnx")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(format_version=FORMAT_VERSION + 1),
         f"format version {FORMAT_VERSION + 1}, this code serves version {FORMAT_VERSION}"),
        (lambda m: m["feature_names"].reverse(),
         "feature 0 is 'prefill_interaction' in the model but 'prefill_tokens' here"),
        (lambda m: m["feature_names"].pop(), "the model has 15 features, this code 16"),
        (lambda m: m.pop("memory_provider"), "metadata names no memory_provider"),
    ],
)
def test_mismatched_metadata_is_refused(trained, tmp_path, change, message):
    _, path, _ = trained
    bad = _rewrite_metadata(path, tmp_path / "bad.onnx", change)
    with pytest.raises(PredictorError, match=f"bad.onnx: {message}"):
        LatencyPredictor.load(bad)


def _with_ranges(source: Path, target: Path, rows: np.ndarray) -> Path:
    """The model at ``source`` with the ranges of ``rows`` recorded, as train records them."""
    return _rewrite_metadata(source, target,
                             lambda m: m.update(feature_ranges=feature_ranges(rows)))


def test_inputs_are_clamped_into_the_recorded_training_range(trained, tmp_path):
    model, path, rows = trained
    clamped = LatencyPredictor.load(_with_ranges(path, tmp_path / "ranged.onnx", rows))
    unclamped = LatencyPredictor.load(path)  # no ranges recorded: served as it is
    low, high = rows.min(axis=0), rows.max(axis=0)
    np.testing.assert_array_equal(clamped.predict(rows), unclamped.predict(rows))
    far = rows[:4].copy()
    used, reserved = FEATURE_NAMES.index("gpu_mem_used_mb"), FEATURE_NAMES.index(
        "cuda_reserved_mb")
    far[:, used] = high[used] * 50  # memory of another engine
    far[:, reserved] = -1.0
    inside = far.copy()
    inside[:, used], inside[:, reserved] = high[used], low[reserved]
    np.testing.assert_array_equal(clamped.predict(far), unclamped.predict(inside))
    assert not np.allclose(unclamped.predict(far), unclamped.predict(inside))
    assert clamped.outside_range(far[0]) == ["gpu_mem_used_mb", "cuda_reserved_mb"]
    assert clamped.outside_range(rows[0]) == [] and unclamped.outside_range(far[0]) == []
    np.testing.assert_allclose(clamped.predict(far), predict(model, inside), rtol=1e-5,
                               atol=1e-4)


def test_training_range_names_what_a_clamped_feature_was_trained_on(trained, tmp_path):
    _model, path, rows = trained
    clamped = LatencyPredictor.load(_with_ranges(path, tmp_path / "ranged.onnx", rows))
    used = FEATURE_NAMES.index("gpu_mem_used_mb")
    low, high = clamped.training_range("gpu_mem_used_mb")
    assert (low, high) == (float(rows[:, used].min()), float(rows[:, used].max()))
    with pytest.raises(KeyError):
        LatencyPredictor.load(path).training_range("gpu_mem_used_mb")  # none recorded


@pytest.mark.parametrize("change", [
    lambda r: r.pop("bias"),
    lambda r: r.update(bias=[2.0, 1.0]),
    lambda r: r.update(bias=[0.0, float("nan")]),
    lambda r: r.update(bias="1"),
])
def test_malformed_feature_ranges_are_refused(trained, tmp_path, change):
    _, path, rows = trained
    ranged = _with_ranges(path, tmp_path / "ranged.onnx", rows)
    bad = _rewrite_metadata(ranged, tmp_path / "bad.onnx",
                            lambda m: change(m["feature_ranges"]))
    with pytest.raises(PredictorError, match="bad.onnx: metadata feature_ranges must map"):
        LatencyPredictor.load(bad)


def test_predict_rejects_rows_of_the_wrong_width(trained):
    _, path, _ = trained
    with pytest.raises(ValueError, match=r"rows of 16 features, got shape \(4, 11\)"):
        LatencyPredictor.load(path).predict(np.zeros((4, 11)))


def test_cann_batches_are_padded_to_few_shapes():
    assert [padded_batch(n) for n in (1, 16, 17, 33, 64, 65)] == [16, 16, 32, 64, 64, 128]


def test_serving_modules_import_neither_torch_nor_onnx():
    """The scheduler imports these; only training may load torch and onnx."""
    code = (
        "import sys\n"
        "import fairsched_plugin.predictor.features, fairsched_plugin.predictor.memory\n"
        "import fairsched_plugin.predictor.profiling, fairsched_plugin.predictor.runtime\n"
        "print(sorted(m for m in ('torch', 'onnx') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
