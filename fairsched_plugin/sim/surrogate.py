"""An ONNX latency model fitted to a step-time model, so LPRS (which needs
``predictor.path``) can run in the simulator on hardware nobody profiled.

A linear model over the 16 predictor features (memory features left at weight 0: the
analytic model does not read them), least squares on random batches of the engine's
shape. The fit error is printed; LPRS then plans against the surrogate while the clock
advances by the step model itself, as a real engine plans with a predictor that is not
the hardware.

    python -m fairsched_plugin.sim.surrogate analytic:rtxpro5000:qwen3-8b out.onnx \
        --budget 4096 --max-seqs 256
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..predictor.export import model_metadata
from ..predictor.features import FEATURE_NAMES, NUM_FEATURES, MemoryState, batch_row
from ..predictor.features import feature_ranges
from ..predictor.model_format import INPUT_NAME, METADATA_KEY, OUTPUT_NAME
from .batch import SimBatch
from .step_models import StepModel, parse_step_model

_MEMORY = [FEATURE_NAMES.index(n) for n in
           ("gpu_mem_used_mb", "gpu_mem_free_mb", "cuda_allocated_mb", "cuda_reserved_mb")]


def sample_batches(n: int, budget: int, max_seqs: int, max_len: int,
                   rng: np.random.Generator) -> list[SimBatch]:
    """Random batches within the budget: 0-``max_seqs`` decodes of random context, and
    prefill chunks filling part of what the decodes leave (no chunk past ``max_len``, as
    no prompt is longer). Both counts are drawn log-uniformly, so the small batches of a
    lightly loaded engine are as well covered as the full ones (LPRS's guard compares
    predictions with every step's measured time, small ones included)."""
    for name, value in (("samples", n), ("budget", budget), ("max_seqs", max_seqs),
                        ("max_len", max_len)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    batches = []
    for _ in range(n):
        decodes = int(np.expm1(rng.uniform(0, np.log1p(max_seqs - 1))))
        decodes = min(decodes, budget)
        batch = SimBatch(decodes=[(int(c), 1) for c in rng.integers(1, max_len, decodes)])
        left = int(np.expm1(rng.uniform(0, np.log1p(budget - decodes))))
        while left > 0 and batch.num_requests < max_seqs:
            chunk = int(rng.integers(1, min(left, max_len) + 1))
            batch.prefills.append((chunk, int(rng.integers(0, max_len - chunk + 1))))
            left -= chunk
        if batch.num_requests == 0:
            batch.decodes.append((1, 1))
        batches.append(batch)
    return batches


def fit(model: StepModel, batches: list[SimBatch]) -> tuple[np.ndarray, float, dict]:
    memory = MemoryState(0.0, 0.0, 0.0, 0.0)
    x = np.stack([batch_row(b.stats(), memory) for b in batches]).astype(np.float64)
    y = np.array([model.step_time_s(b, memory) * 1e3 for b in batches])
    x[:, _MEMORY] = 0.0
    # Least squares on the relative error: a 5 ms step matters as much as a 100 ms one.
    weights, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    error = np.abs(x @ weights - y) / y
    stats = {"samples": len(batches), "mape_pct": float(error.mean() * 100),
             "p90_ape_pct": float(np.percentile(error, 90) * 100)}
    return weights, float(error.mean()), {**stats, "ranges": feature_ranges(x)}


def write(path: Path, weights: np.ndarray, description: str, stats: dict) -> Path:
    w = weights.astype(np.float32).reshape(NUM_FEATURES, 1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", [INPUT_NAME, "w"], ["column"]),
         helper.make_node("Reshape", ["column", "shape"], [OUTPUT_NAME])],
        "surrogate_latency",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", NUM_FEATURES])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=[numpy_helper.from_array(w, "w"),
                     numpy_helper.from_array(np.array([-1], dtype=np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(model_metadata(
        memory_provider="kv_cache", vllm_version="simulated", hardware=description,
        training={"source": "linear fit to a simulator step model",
                  **{k: v for k, v in stats.items() if k != "ranges"}}))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def build(step_model: str, out: Path, budget: int, max_seqs: int, max_len: int,
          samples: int = 4000, seed: int = 0) -> dict:
    """Fit a surrogate to ``step_model`` for an engine of this shape and write it to
    ``out``; returns the fit's statistics. Bad values raise ``ValueError``."""
    model = parse_step_model(step_model)
    batches = sample_batches(samples, budget, max_seqs, max_len, np.random.default_rng(seed))
    weights, _, stats = fit(model, batches)
    write(out, weights, model.description, stats)
    return {**stats, "description": model.description}


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """``fairsched lprs-predictor``: LPRS's latency model without a profiling run."""
    parser = subparsers.add_parser(
        "lprs-predictor",
        help="write a latency model for LPRS from the model's config.json and the device "
             "(the simulator's analytic step model, fitted; no profiling run)",
        description="Writes an ONNX latency model for predictor.path: a linear fit to the "
                    "analytic step time of MODEL on DEVICE, for an engine with these "
                    "limits. LPRS checks it against every measured step and falls back to "
                    "the token budget while it does not fit (lprs.guard_*).")
    parser.add_argument("--device", required=True,
                        help="an accelerator preset (h100, h200, a100-80gb, ascend910b, ...)")
    parser.add_argument("--model", required=True,
                        help="the served model's config.json (or its directory), or a preset "
                             "(qwen3-8b, llama-3-8b)")
    parser.add_argument("--max-num-batched-tokens", type=int, required=True,
                        help="the engine's token budget (vLLM's, as served)")
    parser.add_argument("--max-num-seqs", type=int, required=True,
                        help="the engine's limit on running requests (vLLM's, as served)")
    parser.add_argument("--max-model-len", type=int, required=True,
                        help="the engine's context length (vLLM's, as served)")
    parser.add_argument("--out", type=Path, required=True, help="the model file (.onnx)")
    parser.set_defaults(func=_main_cli)


def _main_cli(args: argparse.Namespace) -> int:
    spec = f"analytic:{args.device}:{args.model}"
    try:
        stats = build(spec, args.out, args.max_num_batched_tokens, args.max_num_seqs,
                      args.max_model_len)
    except ValueError as exc:  # PresetError is one
        print(f"fairsched lprs-predictor: {exc}", file=sys.stderr)
        return 2
    _report(args.out, stats)
    return 0


def _report(out: Path, stats: dict) -> None:
    print(f"{out}: fit to {stats['description']}: MAPE {stats['mape_pct']:.1f}%, "
          f"P90 APE {stats['p90_ape_pct']:.1f}% over {stats['samples']} random batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("step_model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--max-seqs", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        stats = build(args.step_model, args.out, args.budget, args.max_seqs, args.max_len,
                      args.samples, args.seed)
    except ValueError as exc:  # PresetError is one
        parser.error(str(exc))
    _report(args.out, stats)


if __name__ == "__main__":
    main()
