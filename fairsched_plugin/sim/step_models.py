"""Step-time models: how long the simulated engine's steps take.

Chosen on the command line by a spec string:

- ``onnx:PATH`` -- the engine's own trained latency predictor (``fairsched train``), fed
  the same 16 features the adapter computes, memory features from the simulated KV cache;
- ``analytic:ACCEL:MODEL[:field=value...]`` -- FLOPs and bytes of a decoder-only
  transformer (``analytic``) on a preset accelerator (``hardware``), MODEL a preset name or
  a ``config.json`` path; ``field=value`` overrides an accelerator field, e.g.
  ``analytic:h100:qwen3-8b:step_overhead_s=0.002``;
- ``linear:BASE_MS:PER_TOKEN_MS[:DECODE_MS_PER_TOKEN]`` -- base plus a cost per scheduled
  token (decode tokens at their own cost when given): hand-checked cases, tests, and a fit
  to a real engine's step trace (``benchmarks/fit_trace_step_model.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..predictor.features import MemoryState, batch_row
from ..predictor.runtime import LatencyPredictor
from ..predictor import analytic
from ..predictor.batch import SimBatch
from ..predictor.hardware import Accelerator, PresetError, TransformerConfig, accelerator
from ..predictor.hardware import accelerator_key, field_overrides, model_config, with_overrides

MIB = float(1 << 20)


class StepModel(Protocol):
    """Seconds one step takes; ``memory`` is the simulated KV cache's state at dispatch."""

    description: str

    def step_time_s(self, batch: SimBatch, memory: MemoryState) -> float: ...


@dataclass
class LinearStepModel:
    """``base + per_token x prefill tokens + decode_per_token x decode tokens`` (decode
    tokens cost ``per_token`` when ``decode_per_token`` is None): times a test can
    compute by hand, or a least-squares fit to a measured step trace."""

    base_s: float
    per_token_s: float
    decode_per_token_s: float | None = None

    @property
    def description(self) -> str:
        text = f"linear: {self.base_s * 1e3:g} ms + {self.per_token_s * 1e3:g} ms/token"
        if self.decode_per_token_s is not None:
            text += f" (decode {self.decode_per_token_s * 1e3:g} ms/token)"
        return text

    def step_time_s(self, batch: SimBatch, memory: MemoryState) -> float:
        decode = self.per_token_s if self.decode_per_token_s is None else self.decode_per_token_s
        return self.base_s + self.per_token_s * batch.prefill_tokens + decode * batch.decode_tokens


class OnnxStepModel:
    """The trained predictor. Its inputs are clamped into its training range by
    :class:`LatencyPredictor`, so a batch larger than any it was trained on reads as the
    largest it saw (the simulation then under-predicts such steps: ``clamped_steps``
    counts them). A prediction below ``floor_s`` is raised to it: a step is never free."""

    def __init__(self, path: Path, floor_s: float = 1e-4) -> None:
        self.predictor = LatencyPredictor.load(path)
        self.path = path
        self.floor_s = floor_s
        self.clamped_steps = 0
        ranges = self.predictor.metadata.get("feature_ranges") or {}
        self.reserved_mb: float | None = (ranges.get("cuda_reserved_mb") or [None, None])[1]

    @property
    def description(self) -> str:
        return f"onnx: {self.path} (memory provider {self.predictor.metadata['memory_provider']})"

    def step_time_s(self, batch: SimBatch, memory: MemoryState) -> float:
        row = batch_row(batch.stats(), memory)
        if self.predictor.outside_range(row):
            self.clamped_steps += 1
        ms = float(self.predictor.predict(row[np.newaxis, :])[0])
        return max(ms / 1e3, self.floor_s)


@dataclass
class AnalyticStepModel:
    """FLOPs and bytes per step of ``config`` on ``accelerator`` (``analytic``)."""

    config: TransformerConfig
    accelerator: Accelerator
    device: str | None = None
    """The accelerator preset's key, whose ``vllm serve`` defaults the engine takes."""

    @property
    def description(self) -> str:
        a = self.accelerator
        return (f"analytic: {self.config.name} on {a.name} (gemm eff {a.gemm_efficiency:g}, "
                f"attention eff {a.attention_efficiency:g}, bandwidth eff "
                f"{a.bandwidth_efficiency:g}, overhead {a.step_overhead_s * 1e3:g} ms)")

    def step_time_s(self, batch: SimBatch, memory: MemoryState) -> float:
        return analytic.step_time_s(self.config, self.accelerator, batch)


def parse_step_model(spec: str) -> StepModel:
    """A step model from its command-line spec (module docstring); errors name the part."""
    kind, _, rest = spec.partition(":")
    if kind == "onnx":
        if not rest:
            raise PresetError("step model onnx:PATH needs a path")
        return OnnxStepModel(Path(rest))
    if kind == "analytic":
        parts = rest.split(":")
        if len(parts) < 2:
            raise PresetError(f"step model {spec!r}: use analytic:ACCEL:MODEL[:field=value...]")
        device = accelerator_key(parts[0])
        acc = accelerator(device)
        overrides = field_overrides(parts[2:], f"step model {spec!r}")
        return AnalyticStepModel(model_config(parts[1]), with_overrides(acc, **overrides),
                                 device)
    if kind == "linear":
        try:
            values = [float(x) / 1e3 for x in rest.split(":")]
        except ValueError:
            values = []
        if len(values) not in (2, 3):
            raise PresetError(f"step model {spec!r}: use "
                              "linear:BASE_MS:PER_TOKEN_MS[:DECODE_MS_PER_TOKEN]")
        return LinearStepModel(*values)
    raise PresetError(f"unknown step model {spec!r}: use onnx:PATH, "
                      "analytic:ACCEL:MODEL[:field=value...] or "
                      "linear:BASE_MS:PER_TOKEN_MS[:DECODE_MS_PER_TOKEN]")
