"""The analytic step model against hand-computed FLOPs and bytes, and its bad inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fairsched_plugin.predictor import analytic
from fairsched_plugin.predictor.batch import SimBatch
from fairsched_plugin.predictor.hardware import (
    Accelerator,
    PresetError,
    accelerator,
    model_config,
    transformer_config,
)
from fairsched_plugin.sim.step_models import parse_step_model

TINY = transformer_config({"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                           "num_key_value_heads": 1, "intermediate_size": 16,
                           "vocab_size": 32, "torch_dtype": "bfloat16"}, "tiny")
# One prefill chunk of 3 tokens after 2 computed, one decode of 1 token after 5.
BATCH = SimBatch(prefills=[(3, 2)], decodes=[(5, 1)])


def test_flops_and_bytes_by_hand() -> None:
    # head_dim = 8 / 2 = 4. Per layer: q,k,v 8 x (2 + 2 x 1) x 4 = 128, o 2 x 4 x 8 = 64,
    # gated MLP 3 x 8 x 16 = 384: 576 parameters.
    assert analytic.linear_params_per_layer(TINY) == 576
    cost = analytic.step_cost(TINY, BATCH)
    # 4 tokens x 2 FLOPs x 576 parameters x 2 layers
    assert cost.linear_flops == 4 * 2 * 576 * 2 == 9216
    # activations per token: qkv in 8 + out 16, o in 8 + out 8, gate/up in 8 + out 32,
    # down in 16 + out 8 = 104 elements; (576 + 4 x 104) x 2 bytes x 2 layers
    assert cost.linear_bytes == (576 + 4 * 104) * 2 * 2
    # elementwise per token 10 x 8 + 2 x 3 x 4 + 3 x 16 = 152 elements
    assert cost.elementwise_bytes == 2 * 4 * 152 * 2
    # pairs: prefill 3 x 2 + 3 x 4 / 2 = 12, decode 1 x 5 + 1 = 6 -> 18; 4 x 2 heads x 4 dims
    assert cost.attention_flops == 4 * 2 * 4 * 18 * 2 == 1152
    # K and V of (3 + 2) + (5 + 1) = 11 tokens, 1 KV head of 4, 2 bytes, 2 layers
    assert cost.attention_bytes == 2 * 1 * 4 * 2 * 11 * 2
    # LM head: 2 x 8 x 32 per sequence, 2 sequences; weights 8 x 32 x 2 bytes
    assert cost.head_flops == 2 * 8 * 32 * 2
    assert cost.head_bytes == 8 * 32 * 2


def test_time_is_the_roofline_of_each_part() -> None:
    acc = Accelerator("unit", peak_flops=1000.0, bandwidth=100.0, memory_bytes=1e9,
                      gemm_efficiency=1.0, attention_efficiency=0.5,
                      bandwidth_efficiency=1.0, step_overhead_s=0.25)
    c = analytic.step_cost(TINY, BATCH)
    expected = (max(c.linear_flops / 1000, c.linear_bytes / 100) + c.elementwise_bytes / 100
                + max(c.attention_flops / 500, c.attention_bytes / 100)
                + max(c.head_flops / 1000, c.head_bytes / 100) + 0.25)
    assert analytic.step_time_s(TINY, acc, BATCH) == pytest.approx(expected)


def test_presets_are_published_configs() -> None:
    qwen = model_config("qwen3-8b")
    # Qwen3-8B: 36 layers x 2 x 8 KV heads x 128 x 2 bytes = 147,456 bytes per token
    assert qwen.kv_bytes_per_token == 147_456
    # about 8.2 B parameters, 16.4 GB in bf16 (embedding untied)
    assert 16.0e9 < analytic.weight_bytes(qwen) < 16.8e9
    assert analytic.kv_cache_tokens(qwen, accelerator("h100")) > 300_000
    with pytest.raises(ValueError, match="does not fit"):
        analytic.kv_cache_tokens(model_config("llama-3-8b"),
                                 Accelerator("small", 1e12, 1e11, 8e9))


def test_bad_input_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="unknown accelerator 'tpu9'"):
        accelerator("tpu9")
    with pytest.raises(PresetError, match="unknown model 'gpt-9'"):
        model_config("gpt-9")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2,
                                  "intermediate_size": 128, "vocab_size": 100}))
    with pytest.raises(PresetError, match="missing field.*num_hidden_layers"):
        model_config(str(config))
    with pytest.raises(PresetError, match="unknown step model"):
        parse_step_model("magic:1")
    with pytest.raises(PresetError, match="unknown accelerator field"):
        parse_step_model("analytic:h100:qwen3-8b:speed=2")
    from fairsched_plugin.predictor.runtime import PredictorError

    with pytest.raises(PredictorError, match="missing.onnx: no such file"):
        parse_step_model(f"onnx:{tmp_path / 'missing.onnx'}")
    bogus = tmp_path / "bogus.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(PredictorError, match="bogus.onnx"):
        parse_step_model(f"onnx:{bogus}")


def test_a_config_json_path_and_overrides_work(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
         "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 32,
         "torch_dtype": "bfloat16"}))
    model = parse_step_model(f"analytic:h100:{tmp_path}:step_overhead_s=0.5")
    assert model.config.num_layers == 2
    assert model.step_time_s(BATCH, None) == pytest.approx(
        0.5 + analytic.step_time_s(TINY, accelerator("h100"), BATCH)
        - accelerator("h100").step_overhead_s)


def test_calibration_error_on_vidur_stays_small() -> None:
    """The presets' dense-layer times against Vidur's measured A100 Llama-3-8B layers."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import calibrate_presets as calibrate

    _, acc_name, model_name = calibrate.SETS["a100-80gb/llama-3-8b"]
    measured = calibrate.read_measured(calibrate.DATA_DIR / calibrate.SETS[
        "a100-80gb/llama-3-8b"][0])
    err = calibrate.errors(model_config(model_name), accelerator(acc_name), measured)
    assert calibrate.summary(err)["mape_pct"] < 10.0
