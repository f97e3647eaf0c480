"""A hand-made ONNX latency model for scheduler tests: ``base + per_token * scheduled
tokens`` (the ``scheduled_tokens`` feature), optionally ``+ per_used_mib * gpu_mem_used_mb``,
with the metadata serving checks (and, if given, training ranges), so a test can work out
by hand what LPRS must choose."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fairsched_plugin.predictor.export import model_metadata
from fairsched_plugin.predictor.features import FEATURE_NAMES, NUM_FEATURES
from fairsched_plugin.predictor.model_format import INPUT_NAME, METADATA_KEY, OUTPUT_NAME


def write_linear_model(path: Path, base_ms: float, per_token_ms: float,
                       memory_provider: str = "kv_cache", per_used_mib_ms: float = 0.0,
                       feature_ranges: dict[str, list[float]] | None = None) -> Path:
    weights = np.zeros((NUM_FEATURES, 1), dtype=np.float32)
    weights[FEATURE_NAMES.index("scheduled_tokens"), 0] = per_token_ms
    weights[FEATURE_NAMES.index("gpu_mem_used_mb"), 0] = per_used_mib_ms
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [INPUT_NAME, "w"], ["scaled"]),
            helper.make_node("Add", ["scaled", "b"], ["column"]),
            helper.make_node("Reshape", ["column", "shape"], [OUTPUT_NAME]),
        ],
        "linear_latency",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", NUM_FEATURES])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=[
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array([base_ms], dtype=np.float32), "b"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(model_metadata(
        memory_provider=memory_provider, vllm_version="test", hardware="test",
        training={"source": "hand-made linear model for tests"},
        feature_ranges=feature_ranges,
    ))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
