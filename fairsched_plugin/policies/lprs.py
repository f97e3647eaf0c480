"""LPRS, latency-predictive chunk selection (seed 000 §3.2.2, Eq. 6-11, Algorithm 1).

For one prefill candidate: the feasible bound ``h = min(remaining, budget left)``, the
candidate chunks ``{1, h} ∪ {kΔ ≤ h}``, one batched latency prediction for all of them,
and the chunk whose prediction is closest to the target under an asymmetric score
(overflowing the target costs more than underfilling it), ties to the larger chunk.
The predictor is any callable from chunk sizes to predicted batch times in ms, so this
module stays free of ONNX and of vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class PredictionError(ValueError):
    """The predictor failed or returned something that is not a latency."""


@dataclass(frozen=True)
class LPRSParams:
    target_ms: float
    granularity: int
    underfill_penalty: float
    overflow_penalty: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_ms) and self.target_ms > 0):
            raise ValueError(f"lprs.target_ms must be > 0, got {self.target_ms}")
        if self.granularity < 1:
            raise ValueError(f"lprs.granularity must be >= 1, got {self.granularity}")
        if not 0 < self.underfill_penalty < self.overflow_penalty:
            raise ValueError("lprs penalties must satisfy 0 < underfill < overflow, got "
                             f"{self.underfill_penalty} and {self.overflow_penalty}")


@dataclass(frozen=True)
class ChunkChoice:
    chunk: int
    predicted_ms: float
    """The prediction for the chosen chunk (NaN when nothing was scored)."""
    candidates: int


def candidate_chunks(bound: int, granularity: int) -> np.ndarray:
    """Eq. 8, ascending: ``{1, h} ∪ {kΔ | 1 <= kΔ <= h}``; empty when ``h < 1``."""
    if bound < 1:
        return np.empty(0, dtype=np.int64)
    chunks = list(range(granularity, bound + 1, granularity))
    if granularity > 1:
        chunks.insert(0, 1)
    if not chunks or chunks[-1] != bound:
        chunks.append(bound)
    return np.array(chunks, dtype=np.int64)


def score(predicted_ms: float, params: LPRSParams) -> float:
    """Eq. 10: ``λu (T* - T̂)`` below the target, ``λo (T̂ - T*)`` above it."""
    gap = predicted_ms - params.target_ms
    return -gap * params.underfill_penalty if gap <= 0 else gap * params.overflow_penalty


def select_chunk(
    bound: int,
    committed: int,
    predict: Callable[[np.ndarray], np.ndarray],
    params: LPRSParams,
) -> ChunkChoice:
    """Algorithm 1 for one candidate; ``predict`` maps chunk sizes to batch times (ms).

    Raises :class:`PredictionError` when a prediction is NaN, infinite or negative: the
    caller falls back to the token-budget rule for the step.
    """
    chunks = candidate_chunks(bound, params.granularity)
    if len(chunks) == 0:
        return ChunkChoice(0, math.nan, 0)
    try:
        predicted = np.asarray(predict(chunks), dtype=np.float64).reshape(-1)
    except PredictionError:
        raise
    except Exception as exc:  # an ONNX Runtime failure is not a reason to stop serving
        raise PredictionError(f"predictor failed: {exc}") from exc
    if predicted.shape != chunks.shape or not np.all(np.isfinite(predicted)) or np.any(predicted < 0):
        raise PredictionError(
            f"predictor returned {predicted[:8]} for {len(chunks)} candidate chunks"
        )
    # A few dozen candidates: plain Python is faster here than numpy's per-call overhead.
    best, best_score = -1, math.inf
    for i, predicted_ms in enumerate(predicted.tolist()):
        value = score(predicted_ms, params)
        if value <= best_score:  # ascending chunks: a tie goes to the larger one
            best, best_score = i, value
    chunk = int(chunks[best])
    if chunk == 0 and committed == 0 and bound >= 1:  # line 28: never an empty batch
        chunk = 1
    return ChunkChoice(chunk, float(predicted[best]), len(chunks))
