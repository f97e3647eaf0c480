"""One step's prefill decision, in the order it is made (seed 000 §3.2.2-3.3: Algorithm 1,
Eq. 12-14).

The adapter gathers what vLLM knows (the running partial prefills' and the admissible
waiting requests' views, the decodes, free slots, KV room), starts the chunk rule's step
with the decodes (:meth:`LatencyChunkRule.begin_step`, which also sets APC's cap, Eq. 12)
and calls :func:`plan_prefill_caps`; what comes back is one token cap per request, which
the adapter's per-request hook applies inside vLLM's own loop. In between, for every
prefill candidate:

1. **Order.** Running partial prefills and waiting requests are merged in the policy's
   order at ``now`` (:func:`step_rank`; the keys, e.g. Aging's, are in ``aging.py`` and
   its siblings), decodes having taken their tokens first.
2. **Bound.** :class:`CandidateWalk` meets the candidates in that order, each with its
   bound ``h = min(remaining, budget left)`` (Algorithm 1, line 4) under vLLM's own
   per-request limits (:class:`ChunkLimits`), and follows vLLM's admission rules (free
   KV room, a waiting request that gets 0 ends admissions).
3. **Chunk.** Without LPRS, the bound (vLLM's token-budget rule). With LPRS, Algorithm 1:
   the candidate chunks ``{1, h} ∪ {kΔ ≤ h}``, a predicted batch time for each from a
   :class:`BatchLatencyModel`, the one closest to the target (``lprs.select_chunk``).
4. **Alignment.** When on, a chunk that does not finish its prompt is cut back to end on
   a KV block boundary (``alignment.align_chunk``).
5. **APC.** When on, Eq. 14 accepts the chunk, warm-starts a prefill, or holds it back
   (``apc.ActivePrefillControl``, with the step's cap from Eq. 12).
6. **Cap.** The chunk is the candidate's cap; the walk moves on with the budget and KV
   room it leaves.

Steps 3-5 are :class:`LatencyChunkRule`, one per scheduler, built when LPRS, APC or
alignment is on. Without it, steps 3-5 are the bound alone, and :func:`plan_prefill_caps`
takes a shorter road to the same caps (a two-way merge that stops at the last running
prefill; waiting requests get no cap then, vLLM admits them in queue order).

The latency model is the only thing here that is not plain arithmetic; it stays behind
:class:`BatchLatencyModel` (served by ``predictor.runtime.LatencyPredictor``), and its
inputs are built by ``predictor.features`` (numpy only). Nothing here imports vLLM or ONNX
Runtime.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..config import APCConfig, LPRSConfig
from ..predictor.features import FEATURE_NAMES, BatchStats, MemoryState, StepRows, batch_row
from ..predictor.memory import MemoryProvider
from .alignment import align_chunk
from .apc import ActivePrefillControl
from .base import OrderingPolicy, Rank, RequestView
from .lprs import LPRSParams, PredictionError, candidate_chunks, select_chunk
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
    """Decides a prefill candidate's chunk inside the plan (steps 3-5; LPRS, alignment,
    APC)."""

    def choose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """The chunk for ``view``, at most ``bound`` (the feasible ``h``); 0 skips it.
        ``walk.upcoming`` lists this candidate and the ones after it, so a rule can
        prepare the work of several candidates in one go."""


Assumption = Callable[[RequestView, int], "int | None"]
"""What a chunk rule assumes a candidate takes, from its view and bound; None: look no
further."""


# -------------------------------------------------------------------- the step

def plan_prefill_caps(
    policy: OrderingPolicy,
    running_prefills: Iterable[RequestView],
    waiting_in_order: Iterable[RequestView],
    decode_tokens: int,
    token_budget: int,
    free_slots: int,
    free_kv_tokens: int,
    full_sequence_must_fit: bool = True,
    rule: ChunkRule | None = None,
    now: float = 0.0,
    limits: ChunkLimits | None = None,
    by_priority: bool = False,
) -> dict[str, int]:
    """Token caps for the prefill candidates the residual budget reaches.

    Args:
        policy: the ordering; ``waiting_in_order`` must already follow its order at
            ``now`` (:func:`step_rank`).
        running_prefills: running requests with prefill work left (any order).
        waiting_in_order: the waiting requests vLLM's waiting loop can admit this step,
            best first; consumed lazily and only as far as needed, so a long queue costs
            nothing beyond the requests that get budget.
        decode_tokens: tokens (and draft slots) the decodes of this step take before any
            prefill.
        token_budget: the step's hard budget (``max_num_scheduled_tokens``, or less when
            the input budget is smaller).
        free_slots: how many waiting requests may still be admitted (running slots).
        free_kv_tokens: KV-cache room for new tokens. vLLM stops admitting at the first
            waiting request whose blocks cannot be allocated, so from there on the plan
            gives the budget to running prefills only; otherwise a running prefill could
            be held back for a waiting request that never gets in, and with no decodes
            left to free blocks, never progress.
        full_sequence_must_fit: vLLM's ``scheduler_reserve_full_isl``: a waiting request is
            admitted only if its whole prompt fits, not just its first chunk.
        rule: without one, each candidate takes what vLLM's loop would give it (vLLM's
            token-budget rule). With one, the rule picks every chunk, waiting requests'
            included, along a :class:`CandidateWalk`, and the first waiting candidate that
            gets 0 ends admissions for the step, as vLLM's waiting loop stops at a
            request it cannot schedule.
        now: the wall-clock time the order is taken at (it matters only to a policy with
            deadlines).
        limits: vLLM's per-request bounds (long-prefill threshold, draft slots).
        by_priority: vLLM's priority scheduling is on: the request's priority orders
            first, the policy within a priority.

    Returns:
        ``{request_id: cap}`` for every running prefill (0 means "not this step") and,
        with a rule, for the waiting requests it decided (0: admissions end there). The
        plan is never exclusive: a request it has no cap for (a waiting request past the
        point the plan reached) takes whatever budget vLLM's loop still has, so budget
        a planned request could not use (a failed allocation, a prefix-cache hit) still
        goes to work. Without a rule, waiting requests get no cap: vLLM admits them in
        queue order after the running loop, so whatever the plan kept free reaches them.
    """
    limits = limits or ChunkLimits()
    rank = step_rank(policy, now, by_priority)
    running = sorted((rank(view), view) for view in running_prefills)
    caps = {view.request_id: 0 for _key, view in running}
    left = max(token_budget - decode_tokens, 0)
    if left <= limits.slot_cost or (rule is None and not running):
        return caps
    waiting = itertools.islice(waiting_in_order, max(free_slots, 0))
    if rule is not None:
        walk = CandidateWalk(rank, running, waiting, left, free_kv_tokens,
                             full_sequence_must_fit, limits)
        while (candidate := walk.next()) is not None:
            view, bound, is_waiting = candidate
            chunk = rule.choose(view, bound, walk)
            caps[view.request_id] = chunk
            walk.take(is_waiting, chunk)
        return caps
    # The token-budget rule: a two-way merge of the two streams in policy order, ties to
    # the running request, until the last running prefill has its cap.
    candidate = next(waiting, None)
    candidate_key = rank(candidate) if candidate is not None else None
    index = 0
    while left > limits.slot_cost and index < len(running):
        if candidate is not None and candidate_key < running[index][0]:
            bound = limits.bound(candidate.remaining_prefill, left)
            need = candidate.remaining_prefill if full_sequence_must_fit else bound
            if need > free_kv_tokens or bound == 0:
                candidate = None  # vLLM stops admitting here; the rest goes to running
                continue
            chunk = bound
            candidate = next(waiting, None)
            candidate_key = rank(candidate) if candidate is not None else None
        else:
            view = running[index][1]
            chunk = limits.bound(view.remaining_prefill, left)
            caps[view.request_id] = chunk
            index += 1
        if chunk > 0:
            left -= chunk + limits.slot_cost
            free_kv_tokens -= chunk
    return caps


# -------------------------------------------------------------------- 1. order

def step_rank(policy: OrderingPolicy, now: float,
              by_priority: bool = False) -> Callable[[RequestView], Rank]:
    """The order of one step: the policy's at ``now``, under vLLM's priority scheduling
    within the request's priority (smaller first, as vLLM orders it)."""
    rank = policy.ranker(now)
    if not by_priority:
        return rank
    return lambda view: (view.vllm_priority, rank(view))


# ---------------------------------------------- 2. candidates and their bounds

class CandidateWalk:
    """The candidates a chunk rule decides, in policy order: running partial prefills and
    waiting requests merged, each with its bound ``h = min(remaining, budget left)``.

    :meth:`next` gives the current candidate, :meth:`take` records its chunk. Both follow
    vLLM's admission rules, as ``plan_prefill_caps`` documents: a waiting request whose
    prompt (or chunk) does not fit the free KV cache, or that gets 0, ends admissions.
    :meth:`upcoming` runs the same walk ahead on a copy, under assumed chunks. Waiting
    requests are pulled from their iterator only when the walk, or a look ahead, reaches
    them, and each once. ``rank`` is the policy's order in this step
    (``OrderingPolicy.ranker``).
    """

    def __init__(
        self,
        rank: Callable[[RequestView], Rank],
        running: list[tuple[Rank, RequestView]],
        waiting: Iterator[RequestView],
        left: int,
        free_kv_tokens: int,
        full_sequence_must_fit: bool,
        limits: ChunkLimits | None = None,
    ) -> None:
        self._rank = rank
        self._running = running
        self._waiting = waiting
        self._pulled: list[tuple[Rank, RequestView]] = []
        self._drained = False
        self._full = full_sequence_must_fit
        self._limits = limits or ChunkLimits()
        self._position = _Position(0, 0, True, left, free_kv_tokens)

    def next(self) -> tuple[RequestView, int, bool] | None:
        """The current candidate as ``(view, bound, waiting)``, or None: the walk is over."""
        return self._next(self._position)

    def take(self, waiting: bool, chunk: int) -> None:
        """The current candidate (from :meth:`next`) gets ``chunk``."""
        self._take(self._position, waiting, chunk)

    def upcoming(self, assume: Assumption) -> list[tuple[RequestView, int]]:
        """The current candidate and those after it, with their bounds, as the walk would
        meet them if each took ``assume(view, bound)``; up to where the walk would end or
        ``assume`` returns None (that candidate is not listed)."""
        position = self._position.copy()
        listed = []
        while (candidate := self._next(position)) is not None:
            view, bound, waiting = candidate
            chunk = assume(view, bound)
            if chunk is None:
                break
            listed.append((view, bound))
            self._take(position, waiting, chunk)
        return listed

    def _next(self, at: _Position) -> tuple[RequestView, int, bool] | None:
        running, pulled, limits = self._running, self._pulled, self._limits
        while at.left > limits.slot_cost:
            if at.waiting < len(pulled):
                head = pulled[at.waiting] if at.admitting else None
            else:
                head = None if self._drained or not at.admitting else self._pull(at.waiting)
            if head is not None and (at.index == len(running) or head[0] < running[at.index][0]):
                view = head[1]
                remaining = view.remaining_prefill
                bound = limits.bound(remaining, at.left)
                if (remaining if self._full else bound) > at.free_kv_tokens:
                    at.admitting = False  # vLLM stops admitting here; the rest goes to running
                    continue
                return view, bound, True
            if at.index == len(running):
                return None
            view = running[at.index][1]
            return view, limits.bound(view.remaining_prefill, at.left), False
        return None

    def _take(self, at: _Position, waiting: bool, chunk: int) -> None:
        if waiting:
            if chunk == 0:  # as vLLM's waiting loop stops at a request it cannot schedule
                at.admitting = False
                return
            at.waiting += 1
        else:
            at.index += 1
        if chunk > 0:
            at.left -= chunk + self._limits.slot_cost
            at.free_kv_tokens -= chunk

    def _pull(self, index: int) -> tuple[Rank, RequestView] | None:
        """The waiting request at ``index`` in walk order, pulling up to it."""
        pulled = self._pulled
        while len(pulled) <= index:
            view = next(self._waiting, None)
            if view is None:
                self._drained = True
                return None
            pulled.append((self._rank(view), view))
        return pulled[index]


@dataclass(frozen=True, slots=True)
class ChunkLimits:
    """What vLLM's own loop bounds each scheduled request by, besides the budget.

    ``chunk_limit``: the ``long_prefill_token_threshold`` in force this step (0: none);
    vLLM cuts any request's tokens to it. ``slot_cost``: the input budget each scheduled
    request reserves for draft tokens (speculative decoding's
    ``max_num_new_slots_for_drafting``); vLLM stops once no more than that is left.
    """

    chunk_limit: int = 0
    slot_cost: int = 0

    def bound(self, remaining: int, left: int) -> int:
        """The most a candidate with ``remaining`` prefill tokens can get from ``left``."""
        bound = min(remaining, left - self.slot_cost)
        if 0 < self.chunk_limit < bound:
            return self.chunk_limit
        return max(bound, 0)


@dataclass(slots=True)
class _Position:
    """Where a walk stands: the next running and waiting candidate, whether waiting
    requests are still admitted, the budget and the KV room left."""

    index: int
    waiting: int
    admitting: bool
    left: int
    free_kv_tokens: int

    def copy(self) -> _Position:
        return _Position(self.index, self.waiting, self.admitting, self.left,
                         self.free_kv_tokens)


# -------------------------------------------------- 3-5. chunk, alignment, APC

class LatencyChunkRule:
    """Steps 3-5 of the module docstring (LPRS, alignment, APC) as the plan's
    :class:`ChunkRule`.

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
        self.guard = (
            PredictionGuard(GuardParams(lprs.guard_window, lprs.guard_max_error,
                                        lprs.guard_recover_error, lprs.guard_min_fill),
                            lprs.target_ms)
            if lprs.enabled and lprs.guard_window > 0 else None
        )
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

    def choose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """Steps 3-5 for one candidate: LPRS's proposal (or the bound), aligned, then
        APC's decision; the batch grows by the chunk."""
        request_id = view.request_id
        speculation = self._speculation
        if speculation is not None and not speculation.at(request_id, bound):
            self._speculation = None
        apc = self.apc
        remaining = view.remaining_prefill
        self._proposal = None
        # 3. Chunk: Algorithm 1, or the bound.
        if apc is not None and apc.holds_back(request_id):
            proposed = bound  # APC's cap is reached: no prediction can change the outcome
        else:
            proposed = self._propose(view, bound, walk)
        # 4. Alignment.
        if self.align:
            proposed = self._aligned(view.prefill_start, proposed, remaining, self._committed)
        # 5. APC, Eq. 14.
        chunk = proposed
        if apc is not None:
            chunk = apc.choose(request_id, proposed, bound, remaining)
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

    def _aligned(self, computed: int, proposed: int, remaining: int, committed: int) -> int:
        aligned = align_chunk(computed, proposed, remaining, self.block_size)
        # An empty batch still makes progress when no block boundary is in reach.
        return aligned if aligned > 0 or committed > 0 else proposed

    def _propose(self, view: RequestView, bound: int, walk: CandidateWalk) -> int:
        """LPRS's chunk, or the token-budget rule's ``bound`` when LPRS is off, failed in
        this step or its guard has fallen back."""
        if (self.params is None or self._fell_back or bound < 1
                or (self.guard is not None and self.guard.fallen_back)):
            return bound
        speculation = self._speculation
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
        state = [self._committed, apc.active if apc is not None else 0, 0]  # committed, active, rows

        def assume(view: RequestView, bound: int) -> int | None:
            committed, active, rows = state
            request_id = view.request_id
            if bound < 1 or (apc is not None and apc.holds_back(request_id, active)):
                chunks, proposed = _NO_ROWS, bound
            else:
                chunks = candidate_chunks(bound, granularity)
                if rows and rows + len(chunks) > MAX_ROWS_PER_CALL:
                    return None
                state[2] = rows + len(chunks)
                proposed = 1 if small else min(cut_to.get(request_id, bound), bound)
            remaining = view.remaining_prefill
            if align:
                proposed = self._aligned(view.prefill_start, proposed, remaining, committed)
            chunk = proposed
            if apc is not None:
                chunk = apc.would_choose(request_id, proposed, bound, remaining, active)
            if chunk > 0:
                state[0] = committed + chunk
                state[1] = active + 1
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
        return {"lprs_model_ms": model_ms, "lprs_predicted_ms": model_ms + self.bias_ms,
                "lprs_clamped": clamped}

    @property
    def observes_steps(self) -> bool:
        """Whether :meth:`observe_step` must see every step (the bias or the guard)."""
        return self.params is not None and (self.correction > 0 or self.guard is not None)

    def observe_step(self, record: dict[str, Any]) -> None:
        """Step listener: move the bias towards this step's measured - predicted time, and
        let the guard judge the prediction (logging when LPRS falls back or recovers)."""
        predicted = record.get("lprs_model_ms")
        if predicted is None or not math.isfinite(predicted) or record.get("step_time_s") is None:
            return
        measured_ms = record["step_time_s"] * 1000.0
        gap = measured_ms - predicted
        limit = self.params.target_ms if self.params is not None else abs(gap)
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

MAX_ROWS_PER_CALL = 512
"""A look ahead stops before a candidate that would take its call past this many rows
(the first candidate always gets its rows): a wrong assumption wastes at most this many
(about 0.3 us a row on this project's CPU)."""

_NO_ROWS = candidate_chunks(0, 1)


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
