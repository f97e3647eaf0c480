"""The built-in latency model: the simulator's roofline from the 16 features, its online
fit against measured step times (a wrong preset, an unknown device), the device presets,
and LPRS planning as the token budget does until the model is ready."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fairsched_plugin.predictor.features import MemoryState, batch_row
import itertools

from fairsched_plugin.predictor.roofline import (RooflineLatencyModel, built_in_model,
                                                 nonnegative_solve, parse_device,
                                                 preset_for_device, roofline_ms)
from fairsched_plugin.predictor.analytic import step_time_s
from fairsched_plugin.predictor.batch import SimBatch
from fairsched_plugin.predictor.hardware import PresetError, accelerator, model_config

MEMORY = MemoryState(0.0, 0.0, 0.0, 0.0)
QWEN = model_config("qwen3-8b")
H100 = accelerator("h100")


def _batches(rng: np.random.Generator, n: int) -> list[SimBatch]:
    """Steps of a busy engine: up to 300 decodes and at most one prefill chunk."""
    out = []
    for _ in range(n):
        decodes = [(int(c), 1) for c in rng.integers(10, 8000, int(rng.integers(0, 300)))]
        prefills = ([(int(rng.integers(1, 8192)), int(rng.integers(0, 30000)))]
                    if rng.random() < 0.8 or not decodes else [])
        out.append(SimBatch(prefills=prefills, decodes=decodes))
    return out


def _row(batch: SimBatch) -> np.ndarray:
    return batch_row(batch.stats(), MEMORY)


def test_the_roofline_from_features_is_the_simulators_step_time():
    for batch in _batches(np.random.default_rng(0), 200):
        assert roofline_ms(_row(batch)[None, :], QWEN, H100)[0] == pytest.approx(
            step_time_s(QWEN, H100, batch) * 1000.0, rel=1e-4)


@pytest.mark.parametrize("wrong", [
    {"bandwidth_efficiency": 0.63}, {"bandwidth_efficiency": 1.17},
    {"step_overhead_s": 0.0035}])
def test_the_online_fit_corrects_a_wrong_preset(wrong):
    """The engine is an H100 as the preset says; the model starts from a preset that is
    off (bandwidth 0.7x or 1.3x, 2 ms more overhead) and learns the truth from steps."""
    model = RooflineLatencyModel(QWEN, dataclasses.replace(H100, **wrong), "test")
    batches = _batches(np.random.default_rng(1), 400)
    truth = [step_time_s(QWEN, H100, b) * 1000.0 for b in batches]

    def error(sample: slice) -> float:
        predicted = model.predict(np.stack([_row(b) for b in batches[sample]]))
        return float(np.median(np.abs(predicted - truth[sample]) / truth[sample]))

    before = error(slice(300, 400))
    for batch, measured in zip(batches[:300], truth[:300]):
        model.observe(_row(batch), measured)
    after = error(slice(300, 400))
    assert after < 0.05
    assert after < before / 2 or before < 0.05


def test_without_a_preset_it_is_fitted_from_nothing_and_ready_only_after_warmup():
    model = RooflineLatencyModel(QWEN, None, "test")
    batches = _batches(np.random.default_rng(2), 400)
    truth = np.array([step_time_s(QWEN, H100, b) * 1000.0 for b in batches])
    assert not model.ready
    for i, (batch, measured) in enumerate(zip(batches[:300], truth[:300])):
        model.observe(_row(batch), measured)
        assert model.ready == (i + 1 >= model.fit.warmup)
    predicted = model.predict(np.stack([_row(b) for b in batches[300:]]))
    assert np.median(np.abs(predicted - truth[300:]) / truth[300:]) < 0.10


def _objective(gram, moment, w):
    return float(w @ gram @ w - 2.0 * w @ moment)


@pytest.mark.parametrize("seed", range(40))
def test_the_constrained_fit_is_the_best_of_every_sign_pattern(seed):
    """Oracle: every subset of the constrained weights held at 0, the rest solved freely;
    the best feasible one is the constrained optimum."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(30, 5)) + rng.normal(size=5)
    y = x @ rng.normal(size=5) + rng.normal(size=30)
    gram, moment = x.T @ x + 1e-3 * np.eye(5), x.T @ y
    signed = np.array([True, False, False, False, False])
    best = np.inf
    for zeroed in itertools.product([False, True], repeat=4):
        on = np.array([True, *[not z for z in zeroed]])
        w = np.zeros(5)
        w[on] = np.linalg.solve(gram[np.ix_(on, on)], moment[on])
        if (w[1:] >= -1e-12).all():
            best = min(best, _objective(gram, moment, w))
    w = nonnegative_solve(gram, moment, signed)
    assert (w[1:] >= 0).all()
    assert _objective(gram, moment, w) == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_flat_noisy_step_times_never_make_a_bigger_chunk_look_faster():
    """A fake engine's steps take 5 ms whatever the batch: an unconstrained fit of the
    noise gave tokens a negative weight, and LPRS, aiming at 100 ms, cut every chunk."""
    rng = np.random.default_rng(3)
    model = RooflineLatencyModel(QWEN, None, "test")
    for batch in _batches(rng, 200):
        model.observe(_row(batch), 5.0 + rng.normal(0.0, 0.3))
    assert (model.weights[1:] >= 0).all()
    rows = np.stack([_row(SimBatch(prefills=[(n, 0)], decodes=[(500, 1)] * 3))
                     for n in (1, 64, 512, 2048, 8192)])
    predicted = model.predict(rows)
    assert (np.diff(predicted) >= 0).all()


def test_bad_measurements_are_ignored():
    model = RooflineLatencyModel(QWEN, H100, "test")
    row = _row(SimBatch(prefills=[(512, 0)]))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        model.observe(row, bad)
    assert model.steps_seen == 0


@pytest.mark.parametrize("device_type,name,preset", [
    ("cuda", "NVIDIA H100 80GB HBM3", "h100"), ("cuda", "NVIDIA H200", "h200"),
    ("cuda", "NVIDIA A100-SXM4-80GB", "a100-80gb"), ("cuda", "NVIDIA GeForce RTX 4090",
                                                     "rtx4090"),
    ("npu", "Ascend910B2", "ascend910b"), ("cuda", "NVIDIA L4", None), ("cpu", "", None)])
def test_devices_map_to_their_presets(device_type, name, preset):
    assert preset_for_device(device_type, name) == preset


def test_a_device_spec_takes_field_overrides_and_names_bad_ones():
    assert parse_device("h100:bandwidth_efficiency=0.63").bandwidth_efficiency == 0.63
    with pytest.raises(PresetError, match="unknown accelerator"):
        parse_device("h1000")
    with pytest.raises(PresetError, match="not field=value"):
        parse_device("h100:fast")
    with pytest.raises(PresetError, match="unknown accelerator field"):
        parse_device("h100:speed=2")


def test_the_served_models_config_and_the_detected_device(tiny_model):
    """From vLLM's own model config, as the scheduler builds it at start-up."""
    from vllm.config import ModelConfig

    config = ModelConfig(model=str(tiny_model), dtype="float32", skip_tokenizer_init=True)
    on_h100 = built_in_model("auto", "auto", vllm_model_config=config, device_type="cuda",
                             device_name="NVIDIA H100 80GB HBM3")
    assert on_h100.ready and on_h100.acc.name == "H100 SXM"
    assert on_h100.cfg.num_layers == config.hf_text_config.num_hidden_layers
    assert on_h100.cfg.bytes_per_param == 4
    assert "detected: NVIDIA H100 80GB HBM3" in on_h100.describe()
    on_cpu = built_in_model("auto", "auto", vllm_model_config=config, device_type="cpu")
    assert not on_cpu.ready and "no preset for cpu" in on_cpu.describe()


def test_a_config_without_the_usual_fields_is_fitted_from_nothing_not_refused(tmp_path):
    """OPT's config names its MLP ``ffn_dim``: the server still starts, the model learns."""
    from types import SimpleNamespace

    opt = SimpleNamespace(dtype="torch.float16", quantization=None, model="facebook/opt-125m",
                          hf_text_config={"num_hidden_layers": 12, "hidden_size": 768,
                                          "num_attention_heads": 12, "ffn_dim": 3072,
                                          "vocab_size": 50272})
    model = built_in_model("auto", "auto", vllm_model_config=opt, device_type="cuda",
                           device_name="NVIDIA H100 80GB HBM3")
    assert model.acc is None and not model.ready
    assert "missing field(s) intermediate_size" in model.describe()
