"""An ONNX latency model fitted to a step-time model, so LPRS (which needs
``predictor.path``) can run in the simulator on hardware nobody profiled.

A linear model over the 16 predictor features (memory features left at weight 0: the
analytic model does not read them), least squares on random batches of the engine's
shape. The fit error, measured on a fifth of the batches held out of the fit, is printed;
LPRS then plans against the surrogate while the clock advances by the step model itself,
as a real engine plans with a predictor that is not the hardware.

    python -m fairsched_plugin.sim.surrogate analytic:rtxpro5000:qwen3-8b out.onnx \
        --budget 4096 --max-seqs 256
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..cli_types import at_least, positive_int
from ..predictor.features import FEATURE_NAMES, NUM_FEATURES, MemoryState, batch_row
from ..predictor.features import feature_ranges
from ..predictor.model_format import INPUT_NAME, METADATA_KEY, OUTPUT_NAME
from ..user_files import output_file
from ..predictor.batch import SimBatch
from .step_models import StepModel, parse_step_model

_MEMORY = [FEATURE_NAMES.index(n) for n in
           ("gpu_mem_used_mb", "gpu_mem_free_mb", "cuda_allocated_mb", "cuda_reserved_mb")]
MIN_SAMPLES = 10 * NUM_FEATURES
"""Fewer batches than this cannot fit 16 weights and still leave a held-out fifth large
enough to measure the fit on (with 16 or fewer, least squares fits any data exactly)."""
HELD_OUT = 0.2
"""The share of the batches kept out of the fit, to measure its error on."""
SAMPLES_HELP = (f"random batches to draw, at least {MIN_SAMPLES} (10 per feature): four "
                "fifths are fitted, the last fifth measures the fit's error")


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
    """Weights fitted to the first four fifths of ``batches``, and the mean relative
    error on the last fifth, which the fit did not see (on its own batches a fit looks
    better than it is, perfect with 16 or fewer), with the fit's statistics. Fewer than
    :data:`MIN_SAMPLES` batches is a ``ValueError``."""
    if len(batches) < MIN_SAMPLES:
        raise ValueError(f"samples must be >= {MIN_SAMPLES} (10 per feature) to fit the "
                         f"{NUM_FEATURES} weights and measure the fit, got {len(batches)}")
    memory = MemoryState(0.0, 0.0, 0.0, 0.0)
    x = np.stack([batch_row(b.stats(), memory) for b in batches]).astype(np.float64)
    y = np.array([model.step_time_s(b, memory) * 1e3 for b in batches])
    x[:, _MEMORY] = 0.0
    # The batches are drawn independently, so the last ones are as random as any.
    held_out = round(len(batches) * HELD_OUT)
    fit_x, fit_y, test_x, test_y = x[:-held_out], y[:-held_out], x[-held_out:], y[-held_out:]
    # Least squares on the relative error: a 5 ms step matters as much as a 100 ms one.
    weights, *_ = np.linalg.lstsq(fit_x / fit_y[:, None], np.ones_like(fit_y), rcond=None)
    error = np.abs(test_x @ weights - test_y) / test_y
    stats = {"samples": len(batches), "held_out": held_out,
             "mape_pct": float(error.mean() * 100),
             "p90_ape_pct": float(np.percentile(error, 90) * 100)}
    return weights, float(error.mean()), {**stats, "ranges": feature_ranges(fit_x)}


def write(path: Path, weights: np.ndarray, description: str, stats: dict) -> Path:
    # onnx (the predictor extra) only for writing the model.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ..predictor.export import model_metadata

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
    parser.add_argument("--max-num-batched-tokens", type=positive_int, required=True,
                        help="the engine's token budget (vLLM's, as served)")
    parser.add_argument("--max-num-seqs", type=positive_int, required=True,
                        help="the engine's limit on running requests (vLLM's, as served)")
    parser.add_argument("--max-model-len", type=positive_int, required=True,
                        help="the engine's context length (vLLM's, as served)")
    parser.add_argument("--samples", type=at_least(MIN_SAMPLES), default=4000,
                        help=SAMPLES_HELP)
    parser.add_argument("--out", type=Path, required=True, help="the model file (.onnx)")
    parser.set_defaults(func=_main_cli)


def _main_cli(args: argparse.Namespace) -> int:
    spec = f"analytic:{args.device}:{args.model}"
    try:
        stats = build(spec, output_file(args.out), args.max_num_batched_tokens,
                      args.max_num_seqs, args.max_model_len, args.samples)
    except (OSError, ValueError) as exc:  # PresetError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _report(args.out, stats)
    return 0


def _report(out: Path, stats: dict) -> None:
    print(f"{out}: fit to {stats['description']}: MAPE {stats['mape_pct']:.1f}%, "
          f"P90 APE {stats['p90_ape_pct']:.1f}% on {stats['held_out']} held-out random "
          f"batches (fitted on {stats['samples'] - stats['held_out']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("step_model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=positive_int, default=4096)
    parser.add_argument("--max-seqs", type=positive_int, default=256)
    parser.add_argument("--max-len", type=positive_int, default=4096)
    parser.add_argument("--samples", type=at_least(MIN_SAMPLES), default=4000,
                        help=SAMPLES_HELP)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        stats = build(args.step_model, output_file(args.out), args.budget, args.max_seqs,
                      args.max_len, args.samples, args.seed)
    except (OSError, ValueError) as exc:  # PresetError is a ValueError
        parser.error(str(exc))
    _report(args.out, stats)


if __name__ == "__main__":
    main()
