"""Check (and fit) the analytic model against Vidur's measured operator times.

Vidur (github.com/microsoft/vidur, MIT licence) profiles every non-attention operation of
one transformer layer (``data/profiling/compute/<gpu>/<model>/mlp.csv``) at token counts
from 1 to 32,768. ``benchmarks/data/vidur_mlp_*.csv`` holds the tensor-parallel-1 rows of
three of those files, reduced to the median time per operation (ms) per token count. Their
sum is one layer's dense time, which :func:`analytic.layer_dense_time_s` models.
Vidur's attention profiles are not in the public snapshot this project could read, so the
attention part of the model is not checked here.
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fairsched_plugin.predictor.analytic import layer_dense_time_s
from fairsched_plugin.predictor.hardware import (
    Accelerator,
    TransformerConfig,
    accelerator,
    model_config,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
SETS = {
    "a100-80gb/llama-3-8b": ("vidur_mlp_a100-80gb_llama-3-8b.csv", "a100-80gb", "llama-3-8b"),
    "a100-80gb/llama-2-7b": ("vidur_mlp_a100-80gb_llama-2-7b.csv", "a100-80gb", "llama-2-7b"),
    "h100/llama-2-7b": ("vidur_mlp_h100_llama-2-7b.csv", "h100", "llama-2-7b"),
}


@dataclass(frozen=True)
class Measured:
    tokens: np.ndarray
    layer_ms: np.ndarray


def read_measured(path: Path) -> Measured:
    """Token counts and the summed per-layer operation times (ms) of one extract."""
    with open(path) as file:
        rows = list(csv.DictReader(file))
    tokens = np.array([int(r["num_tokens"]) for r in rows])
    total = np.array([sum(float(v) for k, v in r.items() if k.endswith("_ms")) for r in rows])
    return Measured(tokens, total)


def errors(cfg: TransformerConfig, acc: Accelerator, measured: Measured) -> np.ndarray:
    """Relative error (model - measured) / measured per token count."""
    model = np.array([layer_dense_time_s(cfg, acc, int(t)) * 1e3 for t in measured.tokens])
    return (model - measured.layer_ms) / measured.layer_ms


def summary(err: np.ndarray) -> dict[str, float]:
    return {"mape_pct": float(np.mean(np.abs(err)) * 100),
            "median_ape_pct": float(np.median(np.abs(err)) * 100),
            "max_ape_pct": float(np.max(np.abs(err)) * 100),
            "bias_pct": float(np.median(err) * 100)}


def fit(cfg: TransformerConfig, acc: Accelerator, measured: Measured) -> Accelerator:
    """The gemm and bandwidth efficiencies (grid, step 0.01) with the least mean absolute
    log error: a factor-2 miss counts the same either way."""
    best, best_loss = acc, np.inf
    grid = np.arange(0.30, 1.001, 0.01)
    for gemm, bw in itertools.product(grid, grid):
        trial = replace(acc, gemm_efficiency=float(gemm), bandwidth_efficiency=float(bw))
        loss = float(np.mean(np.abs(np.log1p(errors(cfg, trial, measured)))))
        if loss < best_loss:
            best, best_loss = trial, loss
    return best


def report(data_dir: Path = DATA_DIR, fit_on: str = "a100-80gb/llama-3-8b") -> str:
    """Markdown: the presets' error on every set, then efficiencies fitted on ``fit_on``
    and their error on every set (the other two are out of sample)."""
    loaded = {name: (read_measured(data_dir / f), accelerator(a), model_config(m))
              for name, (f, a, m) in SETS.items()}
    measured, acc, cfg = loaded[fit_on]
    fitted = fit(cfg, acc, measured)
    lines = [f"Fitted on {fit_on}: gemm_efficiency {fitted.gemm_efficiency:.2f}, "
             f"bandwidth_efficiency {fitted.bandwidth_efficiency:.2f}", "",
             "| set | token counts | preset MAPE | preset bias | fitted MAPE | fitted median APE "
             "| fitted max APE | fitted bias |", "|---|---|---|---|---|---|---|---|"]
    for name, (m, a, c) in loaded.items():
        before = summary(errors(c, a, m))
        after = summary(errors(c, replace(a, gemm_efficiency=fitted.gemm_efficiency,
                                          bandwidth_efficiency=fitted.bandwidth_efficiency), m))
        lines.append(f"| {name} | {len(m.tokens)} ({m.tokens.min()}-{m.tokens.max()}) | "
                     f"{before['mape_pct']:.1f}% | {before['bias_pct']:+.1f}% | "
                     f"{after['mape_pct']:.1f}% | {after['median_ape_pct']:.1f}% | "
                     f"{after['max_ape_pct']:.1f}% | {after['bias_pct']:+.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
