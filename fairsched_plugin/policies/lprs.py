"""LPRS, latency-predictive chunk selection (the chunked-prefill paper's §3.2.2, Eq. 6-11,
Algorithm 1).

For one prefill candidate: the feasible bound ``h = min(remaining, budget left)``, the
candidate chunks ``{1, h} ∪ {kΔ ≤ h}``, a latency prediction for each, and the chunk whose
prediction is closest to the target under an asymmetric score (overflowing the target
costs more than underfilling it), ties to the larger chunk. The predictions come in as
numbers, so this module stays free of ONNX and of vLLM, and the caller may score many
candidates' sets in one predictor call (``chunk_rule.LatencyChunkRule`` does).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class PredictionError(ValueError):
    """The predictor failed or returned something that is not a latency."""


@dataclass(frozen=True)
class LPRSParams:
    """Algorithm 1's settings, the ``lprs.*`` keys as ``config`` validated them."""

    target_ms: float
    granularity: int
    underfill_penalty: float
    overflow_penalty: float


AUTO_TARGET_TOKENS = 4096
"""``lprs.target_ms: auto``: the target is the predicted time of a step that prefills this
many tokens and nothing else (the token budget's worth, when the budget is smaller).

Why a step's worth of tokens rather than a fixed time: what a step of prefill costs differs
by 3x between an H100 and an A100 or a 910B. A fixed 100 ms, the time of about 4,096
tokens of an 8B model on an H100, cuts an A100's or a 910B's 2,048-token steps (about
150 ms) whenever decodes are running, so bursts drain a third slower and the TTFT tail
grows. With this rule LPRS cuts vLLM's 8,192-token H100/H200 steps back to about 4,096
tokens' time, where they would stall every decode, and on a device whose budget is 2,048
only the steps that decodes would stretch beyond a full-budget prefill."""


def auto_target_tokens(token_budget: int) -> int:
    """The prefill-only step whose predicted time is the automatic target."""
    return max(1, min(token_budget, AUTO_TARGET_TOKENS))


class ChunkChoice(NamedTuple):
    """A named tuple rather than a frozen dataclass: one is built per scored candidate
    every step, and a frozen dataclass costs several times as much to construct."""

    chunk: int
    predicted_ms: float
    """The prediction for the chosen chunk (NaN when nothing was scored)."""
    candidates: int
    index: int
    """The chosen chunk's position in the candidate set (-1 when nothing was scored)."""


@functools.lru_cache(maxsize=4096)
def candidate_chunks(bound: int, granularity: int) -> np.ndarray:
    """Eq. 8, ascending: ``{1, h} ∪ {kΔ | 1 <= kΔ <= h}``; empty when ``h < 1``.

    Cached (read-only arrays): a step asks for the same few bounds again and again, and
    building the set is a noticeable part of scoring a candidate."""
    if bound < 1:
        chunks: list[int] = []
    else:
        chunks = list(range(granularity, bound + 1, granularity))
        if granularity > 1:
            chunks.insert(0, 1)
        if not chunks or chunks[-1] != bound:
            chunks.append(bound)
    array = np.array(chunks, dtype=np.int64)
    array.flags.writeable = False
    return array


def select_chunk(chunks: np.ndarray, predicted: np.ndarray, params: LPRSParams) -> ChunkChoice:
    """Algorithm 1, lines 10-31, for one candidate: ``chunks`` its candidate set
    (:func:`candidate_chunks`, ascending), ``predicted`` the batch time (ms) with each;
    the chunk with the lowest Eq. 10 score, ties to the larger one.
    Line 28's guard against an empty batch holds by construction: a non-empty set
    contains 1, and every chunk in it is at least 1.

    Raises :class:`PredictionError` when a prediction is NaN, infinite or negative, or
    there are not as many as chunks: the caller falls back to the token-budget rule.
    """
    if len(chunks) == 0:
        return ChunkChoice(0, math.nan, 0, -1)
    if len(predicted) != len(chunks):
        raise PredictionError(
            f"predictor returned {len(predicted)} times for {len(chunks)} candidate chunks"
        )
    target, underfill, overflow = (params.target_ms, params.underfill_penalty,
                                   params.overflow_penalty)
    # A few dozen candidates: plain Python is faster here than numpy's per-call overhead,
    # and Eq. 10 is inlined because a function call per candidate is a noticeable share.
    best, best_score = -1, math.inf
    values = predicted.tolist()
    for i, predicted_ms in enumerate(values):
        if not 0.0 <= predicted_ms < math.inf:  # NaN fails both comparisons
            raise PredictionError(
                f"predictor returned {predicted_ms} ms for a chunk of {int(chunks[i])} tokens"
            )
        # Eq. 10: λu (T* - T̂) below the target, λo (T̂ - T*) above it.
        gap = predicted_ms - target
        value = -gap * underfill if gap <= 0 else gap * overflow
        if value <= best_score:  # ascending chunks: a tie goes to the larger one
            best, best_score = i, value
    return ChunkChoice(int(chunks[best]), values[best], len(values), best)
