"""The chunk rule the plan consults when LPRS, APC or alignment is on.

One object per scheduler, reset at the start of every step: it holds the batch as built so
far (decodes first, then each accepted chunk, as ``predictor.features.BatchStats``), asks
LPRS for each candidate's chunk (one batched ONNX Runtime call per candidate), aligns the
chunk end to the KV block size when alignment is on, and lets APC accept, warm-start or
hold it back. A predictor failure or a nonsense prediction (NaN, infinite, negative) makes
the rest of that step use the token-budget rule; it is counted, and logged the first time.

Beyond the paper, predictions carry a running bias: each step that returns moves it by
``lprs.correction`` of the gap between the measured and the predicted time of the batch
actually dispatched. An offline model is off for batch shapes its profile rarely saw (many
one-token chunks, for one) and when the host's speed drifts; the bias follows both.
``lprs.correction: 0`` gives the paper's uncorrected predictor.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import APCConfig, LPRSConfig
from ..policies import RequestView
from ..policies.alignment import align_chunk
from ..policies.apc import ActivePrefillControl
from ..policies.lprs import LPRSParams, PredictionError, select_chunk
from ..policies.plan import CandidateWalk
from ..predictor.features import BatchStats, MemoryState, candidate_rows, feature_matrix, raw_vector
from ..predictor.memory import MemoryProvider
from ..predictor.runtime import LatencyPredictor

logger = logging.getLogger("vllm.fairsched")


class LatencyChunkRule:
    """LPRS, alignment and APC as the plan's :class:`~fairsched_plugin.policies.plan.ChunkRule`."""

    def __init__(
        self,
        lprs: LPRSConfig,
        apc: APCConfig,
        predictor: LatencyPredictor | None,
        memory: MemoryProvider | None,
        block_size: int,
        align: bool,
    ) -> None:
        self.params = (
            LPRSParams(lprs.target_ms, lprs.granularity, lprs.underfill_penalty,
                       lprs.overflow_penalty)
            if lprs.enabled else None
        )
        self.predictor = predictor
        self.memory = memory
        self.block_size = block_size
        self.align = align
        self.apc = (
            ActivePrefillControl(apc.max_active_prefills, apc.min_chunk, apc.max_deferred_steps)
            if apc.enabled else None
        )
        self.fallbacks = 0
        self.correction = lprs.correction
        self.bias_ms = 0.0
        self._batch = BatchStats()
        self._memory_state: MemoryState | None = None
        self._committed = 0
        self._fell_back = False
        self._candidates = 0

    def begin_step(self, decodes: list[tuple[int, int]], max_seqs: int, token_budget: int) -> None:
        """A new step whose decodes are ``(context_len, tokens)`` pairs."""
        self._batch = BatchStats()
        for context_len, tokens in decodes:
            self._batch.add_decode(context_len, tokens)
        self._committed = self._batch.decode_tokens
        self._memory_state = self.memory.read() if self.memory is not None else None
        self._fell_back = False
        self._candidates = 0
        if self.apc is not None:
            self.apc.begin_step(max_seqs, len(decodes), token_budget, self._committed)

    def choose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        if self.apc is not None and self.apc.holds_back(view.request_id):
            proposed = bound  # APC's cap is reached: no prediction can change the outcome
        else:
            proposed = self._propose(view, bound)
        if self.align:
            aligned = align_chunk(view.computed_tokens, proposed, view.remaining_prefill,
                                  self.block_size)
            # An empty batch still makes progress when no block boundary is in reach.
            proposed = aligned if aligned > 0 or self._committed > 0 else proposed
        chunk = proposed
        if self.apc is not None:
            chunk = self.apc.choose(view.request_id, proposed, bound, view.remaining_prefill)
        if chunk > 0:
            self._batch.add_prefill(chunk, view.computed_tokens)
            self._committed += chunk
        return chunk

    def _propose(self, view: RequestView, bound: int) -> int:
        """LPRS's chunk, or the token-budget rule's ``bound`` when LPRS is off or failed."""
        if self.params is None or self._fell_back or bound < 1:
            return bound
        predict = self._predict_with(view.computed_tokens)
        try:
            choice = select_chunk(bound, self._committed, predict, self.params)
        except PredictionError as exc:
            self._fall_back(exc)
            return bound
        self._candidates += choice.candidates
        return choice.chunk

    def _predict_with(self, processed: int) -> Callable[[np.ndarray], np.ndarray]:
        assert self.predictor is not None and self._memory_state is not None
        batch, memory, predictor = self._batch, self._memory_state, self.predictor
        bias = self.bias_ms
        return lambda chunks: predictor.predict(
            candidate_rows(batch, memory, chunks, processed)) + bias

    def _fall_back(self, exc: Exception) -> None:
        self._fell_back = True
        self.fallbacks += 1
        if self.fallbacks == 1:
            logger.warning(
                "fairsched: LPRS fell back to the token-budget rule for this step (%s); "
                "later fallbacks are counted in the trace, not logged", exc,
            )

    def predict_batch(self, batch: BatchStats) -> float:
        """The model's time (ms) for a batch as dispatched, without the bias; NaN without
        LPRS or on failure."""
        if self.params is None or self.predictor is None or self.memory is None:
            return math.nan
        try:
            rows = feature_matrix(raw_vector(batch, self.memory.read())[None, :])
            value = float(self.predictor.predict(rows)[0])
        except Exception:  # the trace field is informative only; the step already ran
            return math.nan
        return value

    def observe_step(self, record: dict[str, Any]) -> None:
        """Step listener: move the bias towards this step's measured - predicted time."""
        predicted = record.get("lprs_model_ms")
        if predicted is None or not math.isfinite(predicted) or record.get("step_time_s") is None:
            return
        gap = record["step_time_s"] * 1000.0 - predicted
        limit = self.params.target_ms if self.params is not None else abs(gap)
        self.bias_ms += self.correction * (max(-limit, min(gap, limit)) - self.bias_ms)

    def step_record(self) -> dict[str, Any]:
        """What this step's plan did, for the trace."""
        record: dict[str, Any] = {}
        if self.params is not None:
            record["lprs_target_ms"] = self.params.target_ms
            record["lprs_bias_ms"] = self.bias_ms
            record["lprs_candidates"] = self._candidates
            record["lprs_fallback"] = self._fell_back
        if self.apc is not None:
            record["apc_cap"] = self.apc.cap
            record["apc"] = dict(self.apc.counts)
        return record

    def forget(self, request_id: str) -> None:
        if self.apc is not None:
            self.apc.forget(request_id)
