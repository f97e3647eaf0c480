"""A prefill candidate's chunk: phases 4.3-4.5 of a step (``plan``'s module docstring).

:class:`LatencyChunkRule` composes them for one candidate after another: LPRS's choice
among candidate chunks by predicted batch time (the search itself is ``lprs``), the cut
back to a KV block boundary (``alignment``) and APC's decision (``apc``); it also keeps
the prediction bias and the predictor guard (``lprs_guard``) and batches the predictor
calls of a step. The latency model is the only thing here that is not plain arithmetic;
it stays behind :class:`BatchLatencyModel` (served by
``predictor.runtime.LatencyPredictor``), and its inputs are built by
``predictor.features`` (numpy only). Nothing here imports vLLM or ONNX Runtime.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from ..predictor.features import FEATURE_NAMES, BatchStats, MemoryState, StepRows, batch_row
from ..predictor.memory import MemoryProvider
from ..settings import AUTO, APCConfig, LPRSConfig
from .alignment import align_chunk, align_up
from .apc import ActivePrefillControl
from .base import RequestView
from .candidate_walk import CandidateWalk
from .lprs import (AUTO_TARGET_TOKENS, LPRSParams, PredictionError, auto_target_tokens,
                   candidate_chunks, select_chunk)
from .lprs_guard import GuardParams, PredictionGuard

logger = logging.getLogger("vllm.fairsched")


class BatchLatencyModel(Protocol):
    """What LPRS needs of a latency model (``predictor.runtime.LatencyPredictor``)."""

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Predicted step time (ms), shape (n,), of ``rows``, n batches' 16-feature rows
        (``predictor.features``): one call scores many candidate batches."""

    def outside_range(self, row: np.ndarray) -> list[str]:
        """The features of one row that lie outside the model's training range, which
        :meth:`predict` clamps into it (none when the model records no range)."""

    def training_range(self, feature: str) -> tuple[float, float]:
        """The lowest and highest value of ``feature`` the model was trained on; asked
        only for a feature :meth:`outside_range` named."""


class ChunkRule(Protocol):
    """Decides a prefill candidate's chunk inside the plan (phases 4.3-4.5; LPRS, alignment,
    APC)."""

    def choose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """The chunk for ``view``, at most ``bound`` (the feasible ``h``); 0 skips it.
        ``walk.upcoming`` lists this candidate and the ones after it, so a rule can
        prepare the work of several candidates in one go."""


class LatencyChunkRule:
    """Phases 4.3-4.5 of the plan (LPRS, alignment, APC) as a :class:`ChunkRule`.

    One object per scheduler, reset at the start of every step (:meth:`begin_step`): it
    holds the batch as built so far (decodes first, then each accepted chunk, as
    ``predictor.features.BatchStats``), asks LPRS for each candidate's chunk, aligns the
    chunk end to the KV block size when alignment is on, and lets APC accept, warm-start
    or hold it back (:meth:`choose`). A predictor failure or a nonsense prediction (NaN,
    infinite, negative) makes the rest of that step use the token-budget rule; it is
    counted, and logged the first time.

    **One batched predictor call per step, in the common case.** Algorithm 1 scores the
    candidates one after another, each against the batch the ones before it built, and an
    ONNX Runtime call costs tens of microseconds however few its rows. So the rule
    speculates: it lists the upcoming candidates (``CandidateWalk.upcoming``) assuming that
    LPRS proposes for each what it proposed in the last step that scored it if the target
    cut that proposal below the bound (steady load repeats itself), else its bound ``h``
    (the token-budget rule), and, once the target has bound in this step, its smallest
    candidate, 1; alignment and APC decide on that assumed proposal as they would. It
    builds every listed candidate's rows against the batch those assumptions build and
    scores all of them in one call. Walking on, a candidate's predictions are exact as
    long as every candidate before it took the chunk assumed for it (the batch, the bounds
    and APC's state are then what the sequential walk has); at the first one that took
    something else the rest are dropped, and the next candidate that needs predictions
    starts another call from the true batch. The chunks are therefore exactly Algorithm
    1's sequential ones (the tests compare them with one call per candidate); a step
    usually makes one call, two when the target binds anew. The batch as dispatched,
    predicted for the bias and the guard, reuses the prediction of the row LPRS scored for
    it when it is that row (:meth:`dispatched`), so it needs no call of its own.

    Beyond the paper, predictions carry a running bias: each step that returns moves it by
    ``lprs.correction`` of the gap between the measured and the predicted time of the
    batch actually dispatched (:meth:`observe_step`). An offline model is off for batch
    shapes its profile rarely saw (many one-token chunks, for one) and when the host's
    speed drifts; the bias follows both. ``lprs.correction: 0`` gives the paper's
    uncorrected predictor.

    Also beyond the paper, LPRS never strangles the engine with a predictor that does not
    fit it: the predictor clamps inputs into the model's training range
    (``predictor.runtime``), and a guard (``lprs_guard``, ``lprs.guard_*``) watches
    predicted against measured step times and falls back to the token-budget rule, with
    one warning, while they disagree; the dispatched batch is still predicted then, and
    LPRS resumes, with one info line, once they agree again.
    """

    def __init__(
        self,
        lprs: LPRSConfig,
        apc: APCConfig,
        predictor: BatchLatencyModel | None,
        memory: MemoryProvider | None,
        block_size: int,
        align: bool,
        token_budget: int = AUTO_TARGET_TOKENS,
    ) -> None:
        self.auto_target = lprs.target_ms == AUTO
        """``lprs.target_ms: auto``: the target follows the model's prediction of a
        prefill-only step (``lprs.AUTO_TARGET_TOKENS``), refreshed every step."""
        self.params = (
            LPRSParams(math.nan if self.auto_target else float(lprs.target_ms),
                       lprs.granularity, lprs.underfill_penalty, lprs.overflow_penalty)
            if lprs.enabled else None
        )
        self.predictor = predictor
        self.memory = memory
        self.block_size = block_size
        self._predict_grown = getattr(predictor, "predict_grown", None)
        """A monotone model's prediction of the batch grown by one chunk (the built-in
        model): when the largest chunk keeps the batch within the target, the search would
        choose it, and is skipped."""
        self._target_model_ms: dict[int, float] = {}
        """A fixed model's prediction of each automatic target's step (one call each)."""
        self.align = align
        self.apc = (
            ActivePrefillControl(apc.max_active_prefills, apc.min_chunk, apc.max_deferred_steps,
                                 block_size=block_size if align else 1)
            if apc.enabled else None
        )
        self.fallbacks = 0
        self.correction = lprs.correction
        self.bias_ms = 0.0
        self.guard = (
            PredictionGuard(GuardParams(lprs.guard_window, lprs.guard_max_error,
                                        lprs.guard_recover_error, lprs.guard_min_fill),
                            self.params.target_ms)
            if self.params is not None and lprs.guard_window > 0 else None
        )
        self._learns = callable(getattr(predictor, "observe", None))
        """The model learns from each dispatched batch's measured time (the built-in one):
        its own fit is the correction, so the running bias stays off (on top of the fit it
        would correct twice, and push small batches' predictions below zero)."""
        if self._learns:
            self.correction = 0.0
        if self.guard is not None and not getattr(predictor, "ready", True):
            # A model that has seen no step of this engine: plan as the token budget does
            # until the guard has seen its predictions agree with the measured times.
            self.guard.fallen_back = True
        self.clamped_steps = 0
        self._batch = BatchStats()
        self._memory_state: MemoryState | None = None
        self._rows: StepRows | None = None
        self._proposal: tuple[_Speculation, int, int] | None = None
        """Where LPRS's proposal for the current candidate came from: the speculation,
        the row and the chunk."""
        self._batch_row: tuple[_Speculation, int] | None = None
        """The scored row that is the batch as built so far, if any."""
        self._committed = 0
        self._fell_back = False
        self._target_binds = False
        self._cut_to: dict[str, int] = {}
        """Each request's LPRS proposal in the last step that scored it, where the target
        cut it below its bound: what a look ahead assumes it proposes again."""
        self._speculation: _Speculation | None = None
        self._candidates = 0
        self._calls = 0
        self._rows_predicted = 0
        if self.auto_target and self.params is not None:
            try:
                self._retarget(token_budget)
            except Exception as exc:  # planned as the token budget does until a step retargets
                logger.warning("fairsched: LPRS's automatic target could not be predicted "
                               "at start-up (%s)", exc)

    def _retarget(self, token_budget: int) -> None:
        """``lprs.target_ms: auto``: the target becomes the predicted time (with the running
        bias) of a step prefilling ``lprs.auto_target_tokens(token_budget)`` tokens from
        an empty batch. A learning model's prediction follows its fit; a fixed model is
        asked once per size."""
        assert self.params is not None and self.predictor is not None
        tokens = auto_target_tokens(token_budget)
        if self._predict_grown is not None:
            model_ms = self._predict_grown(_EMPTY_BATCH, tokens, 0)
        else:
            if tokens not in self._target_model_ms:
                stats = BatchStats()
                stats.add_prefill(tokens, 0)
                memory = self._memory_state or (self.memory.read() if self.memory else
                                                MemoryState(0.0, 0.0, 0.0, 0.0))
                self._target_model_ms[tokens] = float(
                    self.predictor.predict(batch_row(stats, memory)[None, :])[0])
            model_ms = self._target_model_ms[tokens]
        target = model_ms + self.bias_ms
        if target != self.params.target_ms and math.isfinite(target) and target > 0:
            self.params = replace(self.params, target_ms=target)
            if self.guard is not None:
                self.guard.target_ms = target

    def begin_step(self, decodes: list[tuple[int, int]], max_seqs: int, token_budget: int) -> None:
        """A new step whose decodes are ``(context_len, tokens)`` pairs."""
        self._batch = BatchStats()
        for context_len, tokens in decodes:
            self._batch.add_decode(context_len, tokens)
        self._committed = self._batch.decode_tokens
        self._memory_state = self.memory.read() if self.params is not None else None
        self._rows = None  # built when a prediction is first needed
        self._batch_row = None
        self._fell_back = False
        self._target_binds = False
        self._speculation = None
        self._candidates = 0
        self._calls = 0
        self._rows_predicted = 0
        if self.apc is not None:
            self.apc.begin_step(max_seqs, len(decodes), token_budget, self._committed)
        if self.auto_target and self.params is not None:
            try:
                self._retarget(token_budget)
            except Exception as exc:  # a failing predictor must not stop serving
                self._fall_back(PredictionError(f"predictor failed: {exc}"))

    def choose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """Phases 4.3-4.5 for one candidate: LPRS's proposal (or the bound), aligned, then
        APC's decision; the batch grows by the chunk."""
        request_id = view.request_id
        speculation = self._speculation
        if speculation is not None and not speculation.at(request_id, bound):
            self._speculation = None
        apc = self.apc
        remaining = view.remaining_prefill
        self._proposal = None
        # 3. Chunk: Algorithm 1, or the bound.
        if apc is not None and apc.holds_back(request_id, bound >= remaining):
            proposed = bound  # APC's cap is reached: no prediction can change the outcome
        else:
            proposed = self._propose(view, bound, walk)
        # 4. Alignment.
        if self.align:
            proposed = self._aligned(view.prefill_start, proposed, remaining, self._committed,
                                     bound)
        # 5. APC, Eq. 14.
        chunk = proposed
        if apc is not None:
            chunk = apc.choose(request_id, proposed, bound, remaining, view.prefill_start)
        if chunk > 0:
            self._batch.add_prefill(chunk, view.prefill_start)
            self._committed += chunk
            proposal = self._proposal
            self._batch_row = (
                (proposal[0], proposal[1]) if proposal is not None and proposal[2] == chunk
                else None
            )
        speculation = self._speculation
        if speculation is not None:
            cursor = speculation.cursor + 1
            if speculation.assumed[cursor - 1] == chunk and cursor < len(speculation.ids):
                speculation.cursor = cursor
            else:  # the rest was built on another batch, or there is no rest
                self._speculation = None
        return chunk

    def _aligned(self, computed: int, proposed: int, remaining: int, committed: int,
                 bound: int) -> int:
        aligned = align_chunk(computed, proposed, remaining, self.block_size)
        if aligned > 0 or committed > 0 or proposed < 1:
            return aligned
        # An empty batch still makes progress.
        return align_up(computed, proposed, remaining, bound, self.block_size)

    def _propose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """LPRS's chunk, or the token-budget rule's ``bound`` when LPRS is off, failed in
        this step or its guard has fallen back."""
        if (self.params is None or self._fell_back or bound < 1
                or not self.params.target_ms > 0.0  # an automatic target not predicted yet
                or (self.guard is not None and self.guard.fallen_back)
                or not getattr(self.predictor, "ready", True)):
            return bound
        speculation = self._speculation
        grown = self._predict_grown
        # (A negative bias could make a smaller chunk's prediction negative, which the
        # search treats as a failure: it runs then.)
        if (speculation is None and grown is not None and self.bias_ms >= 0.0
                and grown(self._batch, bound, view.prefill_start) + self.bias_ms
                <= self.params.target_ms):
            self._cut_to.pop(view.request_id, None)
            return bound
        if speculation is None or len(speculation.chunk_sets[speculation.cursor]) == 0:
            try:
                speculation = self._speculate(walk)
            except PredictionError as exc:
                self._fall_back(exc)
                return bound
            except Exception as exc:  # an ONNX Runtime failure is not a reason to stop serving
                self._fall_back(PredictionError(f"predictor failed: {exc}"))
                return bound
            self._speculation = speculation
        k = speculation.cursor
        start = speculation.starts[k]
        chunks = speculation.chunk_sets[k]
        try:
            choice = select_chunk(chunks, speculation.predicted[start:start + len(chunks)],
                                  self.params)
        except PredictionError as exc:
            self._fall_back(exc)
            return bound
        self._candidates += choice.candidates
        self._proposal = (speculation, start + choice.index, choice.chunk)
        if choice.chunk < bound:
            self._target_binds = True
            self._cut_to[view.request_id] = choice.chunk
        else:
            self._cut_to.pop(view.request_id, None)
        return choice.chunk

    def _speculate(self, walk: CandidateWalk) -> _Speculation:
        """List the upcoming candidates under the assumptions the class docstring describes
        and score all of them in one predictor call."""
        assert self.params is not None and self.predictor is not None
        granularity = self.params.granularity
        apc, align = self.apc, self.align
        small = self._target_binds
        cut_to = self._cut_to
        speculation = _Speculation()
        candidates: list[tuple[int, int, np.ndarray]] = []
        # committed, unfinished prefills, rows, any prefill
        state = [self._committed, apc.active if apc is not None else 0, 0,
                 apc.started if apc is not None else False]

        def assume(view: RequestView, bound: int) -> int | None:
            committed, active, rows, started = state
            request_id = view.request_id
            remaining = view.remaining_prefill
            if bound < 1 or (apc is not None
                             and apc.holds_back(request_id, bound >= remaining, active)):
                chunks, proposed = _NO_ROWS, bound
            else:
                chunks = candidate_chunks(bound, granularity)
                if rows and rows + len(chunks) > MAX_ROWS_PER_CALL:
                    return None
                state[2] = rows + len(chunks)
                proposed = 1 if small else min(cut_to.get(request_id, bound), bound)
            if align:
                proposed = self._aligned(view.prefill_start, proposed, remaining, committed,
                                         bound)
            chunk = proposed
            if apc is not None:
                chunk = apc.would_choose(request_id, proposed, bound, remaining, active,
                                         started, view.prefill_start)
            if chunk > 0:
                state[0] = committed + chunk
                state[1] = active + (chunk < remaining)
                state[3] = True
            speculation.ids.append(request_id)
            speculation.bounds.append(bound)
            speculation.assumed.append(chunk)
            speculation.chunk_sets.append(chunks)
            speculation.starts.append(rows)
            candidates.append((view.prefill_start, chunk, chunks))
            return chunk

        walk.upcoming(assume)
        if self._rows is None:
            assert self._memory_state is not None
            self._rows = StepRows(self._batch, self._memory_state)
        rows = self._rows.rows(self._batch, candidates)
        model_ms = self.predictor.predict(rows)
        if model_ms.shape != (len(rows),):
            raise PredictionError(f"predictor returned shape {model_ms.shape} for "
                                  f"{len(rows)} rows")
        speculation.rows = rows
        speculation.model_ms = model_ms
        speculation.predicted = (model_ms + self.bias_ms).astype(np.float64)
        self._calls += 1
        self._rows_predicted += len(rows)
        return speculation

    def _fall_back(self, exc: Exception) -> None:
        self._fell_back = True
        self._speculation = None
        self.fallbacks += 1
        if self.fallbacks == 1:
            logger.warning(
                "fairsched: LPRS fell back to the token-budget rule for this step (%s); "
                "later fallbacks are counted in the trace, not logged", exc,
            )

    def dispatched(self, batch: BatchStats) -> dict[str, Any]:
        """Trace fields of a batch as dispatched (LPRS on): the model's time for it without
        the bias (``lprs_model_ms``; NaN when the predictor fails), with it
        (``lprs_predicted_ms``), and the features the predictor clamped into its training
        range (``lprs_clamped``). Predicted also while the guard has fallen back, so that
        it can see the model agree again. The first clamped batch is logged.

        The batch is predicted with the memory state the step was planned with, as LPRS
        predicted its candidates: the bias corrects those predictions. When the batch is
        the one LPRS built and scored while planning (the same batch, so the same feature
        row), that prediction is reused: an ONNX Runtime call after vLLM's own scheduling work
        runs cold, at about 40 us here, a large share of LPRS's cost per step."""
        assert self.predictor is not None and self._memory_state is not None
        try:
            scored = self._batch_row
            if scored is not None and batch == self._batch:
                # The scored row was built from this very batch (``_batch_row`` is reset
                # whenever the batch grows past it): no feature row to build or compare.
                row = scored[0].rows[scored[1]]
                model_ms = float(scored[0].model_ms[scored[1]])
            else:
                row = batch_row(batch, self._memory_state)
                model_ms = float(self.predictor.predict(row[None, :])[0])
        except Exception:  # the trace field is informative only; the step already ran
            return {"lprs_model_ms": math.nan, "lprs_predicted_ms": math.nan,
                    "lprs_clamped": []}
        clamped = self.predictor.outside_range(row)
        if clamped:
            self.clamped_steps += 1
            if self.clamped_steps == 1:
                detail = ", ".join(
                    f"{name} {row[FEATURE_NAMES.index(name)]:g} (trained on {low:g}..{high:g})"
                    for name in clamped for low, high in [self.predictor.training_range(name)]
                )
                logger.warning(
                    "fairsched: a dispatched batch lies outside the latency model's training "
                    "range: %s; the predictor clamps such features into the range (a model "
                    "trained on another engine?); later ones are counted in the trace "
                    "(lprs_clamped)", detail,
                )
        record = {"lprs_model_ms": model_ms, "lprs_predicted_ms": model_ms + self.bias_ms,
                  "lprs_clamped": clamped,
                  # A cut shaped the step only if vLLM dispatched the prefill the plan
                  # built (not when, say, the KV cache kept it from admitting it): the
                  # guard reads this.
                  "lprs_cut": (self._target_binds
                               and batch.prefill_tokens >= self._batch.prefill_tokens > 0)}
        if self._learns:
            record[LEARNING_ROW] = row  # taken out again by observe_step
        return record

    @property
    def model_source(self) -> str:
        """Where the latency model came from (the built-in one says how it is fitted now)."""
        describe = getattr(self.predictor, "describe", None)
        return describe() if callable(describe) else "a trained model (predictor.path)"

    @property
    def observes_steps(self) -> bool:
        """Whether :meth:`observe_step` must see every step (the bias or the guard)."""
        return self.params is not None and (self.correction > 0 or self.guard is not None
                                            or self._learns)

    def observe_step(self, record: dict[str, Any]) -> None:
        """Step listener: let a learning model fit this step's measured time, move the bias
        towards the measured - predicted time, and let the guard judge the prediction
        (logging when LPRS falls back or recovers)."""
        row = record.pop(LEARNING_ROW, None)
        predicted = record.get("lprs_model_ms")
        if predicted is None or not math.isfinite(predicted) or record.get("step_time_s") is None:
            return
        measured_ms = record["step_time_s"] * 1000.0
        if row is not None:
            self.predictor.observe(row, measured_ms)
        gap = measured_ms - predicted
        # An automatic target not predicted yet is NaN, and would make the bias NaN.
        limit = (self.params.target_ms
                 if self.params is not None and math.isfinite(self.params.target_ms)
                 else abs(gap))
        self.bias_ms += self.correction * (max(-limit, min(gap, limit)) - self.bias_ms)
        if self.guard is None:
            return
        change = self.guard.observe(record["lprs_predicted_ms"], measured_ms,
                                    record.get("lprs_cut", False))
        if change is None:
            return
        if self.guard.fallen_back:
            logger.warning("fairsched: LPRS falls back to the token-budget rule: %s. The "
                           "latency model does not fit this engine (retrain it here); "
                           "LPRS resumes when its predictions agree again", change)
        else:
            logger.info("fairsched: LPRS resumes: %s", change)

    def step_record(self) -> dict[str, Any]:
        """What this step's plan did, for the trace."""
        record: dict[str, Any] = {}
        if self.params is not None:
            record["lprs_target_ms"] = self.params.target_ms
            record["lprs_bias_ms"] = self.bias_ms
            record["lprs_candidates"] = self._candidates
            record["lprs_calls"] = self._calls
            record["lprs_rows"] = self._rows_predicted
            record["lprs_fallback"] = self._fell_back
            record["lprs_cut"] = self._target_binds
            record["lprs_guard"] = self.guard is not None and self.guard.fallen_back
        if self.apc is not None:
            record["apc_cap"] = self.apc.cap
            record["apc"] = dict(self.apc.counts)
        return record

    def forget(self, request_id: str) -> None:
        self._cut_to.pop(request_id, None)
        if self.apc is not None:
            self.apc.forget(request_id)


# ----------------------------------------------------------- LPRS's look ahead

LEARNING_ROW = "_lprs_row"
"""The step record's key for the dispatched batch's features, from :meth:`dispatched` to
:meth:`observe_step` (two steps apart under async scheduling); never written out."""

MAX_ROWS_PER_CALL = 512
"""A look ahead stops before a candidate that would take its call past this many rows
(the first candidate always gets its rows): a wrong assumption wastes at most this many
(about 0.3 us a row on this project's CPU)."""

_NO_ROWS = candidate_chunks(0, 1)
_EMPTY_BATCH = BatchStats()
"""The batch an automatic target's step grows from (read, never changed)."""


class _Speculation:
    """One predictor call's results for the candidates a look ahead listed, and how far
    the walk has confirmed the assumptions they were built on."""

    __slots__ = ("ids", "bounds", "assumed", "chunk_sets", "starts", "rows", "model_ms",
                 "predicted", "cursor")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.bounds: list[int] = []
        self.assumed: list[int] = []
        self.chunk_sets: list[np.ndarray] = []
        self.starts: list[int] = []
        """Each candidate's first row in ``rows``."""
        self.rows: np.ndarray = np.empty((0, 0))
        self.model_ms: np.ndarray = np.empty(0)
        """The model's time for each row, without the bias."""
        self.predicted: np.ndarray = np.empty(0)
        """With the bias, as LPRS scores it."""
        self.cursor = 0
        """The candidate the walk is at; every one before it took its assumed chunk."""

    def at(self, request_id: str, bound: int) -> bool:
        """Whether the walk's current candidate is the one this speculation expects there
        (it is whenever the assumptions held, since the walk is deterministic)."""
        return self.ids[self.cursor] == request_id and self.bounds[self.cursor] == bound
