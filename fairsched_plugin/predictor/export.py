"""Export a trained latency model to ONNX with the metadata serving checks (``model_format``).

torch's TorchScript-based exporter is used (``dynamo=False``): for a Gemm/ReLU MLP it is
exact and needs nothing beyond torch and onnx, where the newer exporter also needs
onnxscript. Opset 17 loads in every ONNX Runtime from 1.14 on. The file is written
atomically, so a server never reads a half-written model.

This module imports torch and onnx; the scheduler never imports it.
"""

from __future__ import annotations

import io
import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
import torch

from .features import FEATURE_NAMES, FEATURE_UNITS, NUM_FEATURES
from .model_format import FORMAT_VERSION, INPUT_NAME, METADATA_KEY, OUTPUT_NAME
from .train import LatencyMLP

OPSET = 17


def model_metadata(
    *, memory_provider: str, vllm_version: str, hardware: str, training: Mapping[str, Any],
    feature_ranges: Mapping[str, list[float]] | None = None,
) -> dict[str, Any]:
    """The ``fairsched`` metadata entry of a model (fields in ``model_format``);
    ``feature_ranges`` from :func:`~fairsched_plugin.predictor.features.feature_ranges`
    of the training split."""
    metadata = {
        "format_version": FORMAT_VERSION,
        "feature_names": list(FEATURE_NAMES),
        "feature_units": dict(FEATURE_UNITS),
        "output_unit": "ms",
        "memory_provider": memory_provider,
        "vllm_version": vllm_version,
        "hardware": hardware,
        "training": dict(training),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if feature_ranges is not None:
        metadata["feature_ranges"] = {name: list(feature_ranges[name]) for name in FEATURE_NAMES}
    return metadata


def export_onnx(model: LatencyMLP, path: str | Path, metadata: Mapping[str, Any]) -> Path:
    """Write ``model`` to ``path`` as ONNX with a dynamic batch axis and ``metadata``."""
    path = Path(path)
    model.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The TorchScript exporter announces its deprecation on every call.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(2, NUM_FEATURES),),
            buffer,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    proto = onnx.load_from_string(buffer.getvalue())
    proto.doc_string = "fairsched batch-latency predictor: 16 raw features -> latency (ms)"
    entry = proto.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(metadata)
    onnx.checker.check_model(proto)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    onnx.save(proto, partial)
    os.replace(partial, path)
    return path
