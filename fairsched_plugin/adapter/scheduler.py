"""vLLM scheduler subclasses that order requests by a fairsched policy.

vLLM's ``schedule()`` is wrapped, never copied. Per step:

1. the policy refreshes the online state its keys read (output-length estimates, tier
   service, KV pressure); when that changed, the waiting heaps are re-keyed;
2. with ``service: ranked`` (the seed-002 semantics), only the top ``max_batch_size``
   requests by key, running and waiting together, are served: running requests outside the
   top are hidden from vLLM's loop for the step (keeping their KV cache) and admissions
   are capped at the waiting requests inside it; with ``decode_share``, while prefill
   work waits, the newest decodes beyond that share of the budget are hidden the same
   way (``policies.decode_hold``);
3. with ``decodes_first`` (seed 000's service), or a policy that orders decodes, the
   running list is reordered in place: decodes first (by key, except under policies that
   keep vLLM's admission order), then partial prefills by rank, best first; otherwise
   vLLM's running order stays as it is;
4. the plan (``policies.plan_prefill_caps``) gives each running partial prefill the tokens
   the residual budget leaves it once the decodes and every better-ranked candidate,
   waiting requests included, have taken their share (the caps add up to the budget, so
   the running order does not change who gets what). Without a chunk rule it is skipped
   when vLLM's loop would give the same: the decodes come first in the running list, the
   partial prefills follow in rank order, and the first admissible waiting request ranks
   after them (the common light step, checked with one look at the queue's head, and
   not looked at again while nothing has entered the queues since);
5. vLLM's own ``schedule()`` runs; its per-request hook ``_reserve_prefill_lookahead``
   returns ``min(n, cap)`` for running partial prefills (0 skips one for this step), and
   the waiting queue, a heap on the same key, admits in policy order until a waiting
   request the plan gives nothing (admissions close there, on every vLLM release).

The plan sees only the waiting requests vLLM's loop can admit this step
(``adapter.admission``: pause states, blocked and stale requests, LoRA slots), models
vLLM's per-request bounds (long-prefill threshold, draft slots, in-flight decodes), and
is never exclusive: a request it has no cap for takes what budget is left, as in stock
vLLM. A waiting request's remaining work is its uncached part (a side-effect-free lookup
in the prefix cache when it enters the queue). Under ``--scheduling-policy priority``,
vLLM's priority orders first and the policy within a priority.

An error in the plugin's own per-step work (ordering, hiding, planning, memory reads, the
trace) degrades that step to vLLM's own behaviour and is logged once per place.

``fcfs`` is vLLM's own order, so steps 3 and 4 are skipped for it: it is an exact
control arm against stock vLLM. A policy with deadlines (the guarded ones) gets each
request's deadline when it arrives, from the prefill work queued ahead of it and the recent
backlog, counted in served prefill tokens; its queues keep the overdue lane in a second heap.

vLLM's FCFS preemption takes ``running[-1]``: in vLLM's running order the most recently
admitted request; with the reorder, the lowest-ranked partial prefill or, when none is
running, the last decode.

With a ``trace_path``, the automatic Aging alpha or ``profile.path``, a
:class:`StepMonitor` also measures every step, from ``_update_after_schedule`` (dispatch)
to ``update_from_output`` (output back), and feeds the trace file, the alpha calibration
and the predictor profile (the batch's 11 raw features and its measured time per row).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Generator
from contextlib import closing
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from ..config import FairschedConfig, load_config
from ..predictor.features import BatchStats
from ..predictor.memory import make_memory_provider
from ..predictor.runtime import LatencyPredictor
from ..policies import (
    AgingPolicy,
    AutoAlpha,
    PrefillRateEstimator,
    Rank,
    RequestView,
    make_policy,
    plan_prefill_caps,
    ranked_service,
)
from ..policies.decode_hold import decode_cap, decodes_to_hold, newest_within_tpot
from ..policies.plan import ChunkLimits, LatencyChunkRule, step_rank
from .admission import LoraSlots, admissible, admitting_queues, free_running_slots, pause_state
from .admission import PAUSED_ALL, UNPAUSED
from .compat import check_scheduler_state, log_surface, wire
from .profiling import StepProfiler, kv_state_reader
from .queue import PolicyRequestQueue, PriorityLevelQueue
from .steps import StepMonitor

# A child of "vllm": start-up lines appear in vLLM's own log stream and format.
logger = logging.getLogger("vllm.fairsched")

VllmCompat = wire(Scheduler, Request, vllm.__version__)
"""This vLLM's scheduler surface, decided once at import (adapter/compat.py)."""

COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
"""Finished on their own: their output length is a sample for the estimators (an aborted
request's is not)."""


def request_view(request: Request, deadline: float = math.inf,
                 cached_tokens: int = 0) -> RequestView:
    """The policy layer's copy of a vLLM request.

    A waiting request always has a token to compute: vLLM recomputes the last one even
    when the prefix cache or a KV transfer holds them all (it needs its logits)."""
    computed = request.num_computed_tokens
    if request.status != RequestStatus.RUNNING:
        computed = min(computed, max(request.num_tokens - 1, 0))
    # Positional: a third of the keyword call's cost, for a view built per candidate
    # per step (the fields in RequestView's order).
    return RequestView(request.request_id, request.arrival_time, request.num_prompt_tokens,
                       computed, request.num_output_tokens, request.max_tokens,
                       request.priority, deadline, cached_tokens)


def prefill_work(request: Request) -> int:
    """Tokens a waiting or running request still has to prefill."""
    return max(request.num_tokens - request.num_computed_tokens, 0)


def has_prefill_work(request: Request, num_computed_tokens: int) -> bool:
    """Whether the next tokens after ``num_computed_tokens`` are prefill, not a decode.

    Prompt tokens are left (even one: the prompt's last chunk), or more than one token
    (a preempted request recomputing its output). A decode computes the one token
    sampled last; under async scheduling its in-flight token is already counted,
    leaving zero. Speculative tokens are not in ``num_tokens``.
    """
    return (num_computed_tokens < request.num_prompt_tokens
            or request.num_tokens - num_computed_tokens > 1)


def _may_read_prefix_cache(manager: Any, request: Request) -> bool:
    """vLLM's own test (``prefix_cache_lookup_enabled``, 0.32+), or what it tests on
    older releases: caching on and the request not skipping cache reads."""
    enabled = getattr(manager, "prefix_cache_lookup_enabled", None)
    if enabled is not None:
        return enabled(request)
    return manager.enable_caching and not request.skip_reading_prefix_cache


def _longest_cache_hit(request: Request, aux_output_connector: Any) -> int:
    """The longest hit vLLM accepts: all but the last token, bounded from 0.34 on by the
    request's own limit (prompt logprobs, skipped cache reads) and by the auxiliary-output
    connector's (the outputs it retains for the prefix)."""
    bound = (None if aux_output_connector is None
             else aux_output_connector.max_cache_hit(request))
    limit = getattr(request, "get_max_cache_hit_length", None)
    if limit is not None:
        return limit(bound)
    return request.num_tokens - 1 if bound is None else min(bound, request.num_tokens - 1)


def _view_deadline(view: RequestView) -> float:
    return view.deadline


def _view_work(view: RequestView) -> int:
    return view.remaining_prefill


def per_engine_path(path: str, parallel_config: Any) -> str:
    """``path`` with the data-parallel rank before its suffix when several engine cores
    run (``trace.jsonl`` -> ``trace.dp1.jsonl``), so their files do not collide."""
    if getattr(parallel_config, "data_parallel_size", 1) <= 1:
        return path
    rank = getattr(parallel_config, "data_parallel_rank", 0)
    stem, dot, suffix = path.rpartition(".")
    if not dot or "/" in suffix:
        return f"{path}.dp{rank}"
    return f"{stem}.dp{rank}.{suffix}"


def _vllm_config_of(args: tuple, kwargs: dict) -> Any:
    """vLLM passes constructor arguments by keyword; accept the first positional too."""
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


class FairSchedulingMixin(VllmCompat):  # type: ignore[misc,valid-type]
    """Policy-ordered prefills for any vLLM ``Scheduler`` subclass (see module docstring)."""

    _steps: StepMonitor | None = None
    """Set in ``__init__``; the class default keeps ``update_from_output`` working on a
    scheduler built without it (vLLM's own tests build one with ``object.__new__``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ``clock``: what "now" is for the policy (ages, deadlines) and the step monitor;
        # the simulator passes its virtual clock, a server the wall clock.
        self._clock: Callable[[], float] = kwargs.pop("clock", None) or time.time
        vllm_config = _vllm_config_of(args, kwargs)
        config = self.fairsched_config = load_config(vllm_config.additional_config)
        self.fairsched_policy = make_policy(config, epoch=self._clock())
        super().__init__(*args, **kwargs)
        check_scheduler_state(self)
        log_surface(logger, VllmCompat, vllm.__version__)
        policy = self.fairsched_policy
        self._now = self._clock()
        self._deadlines: dict[str, float] = {}
        self._cached_prefix: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._running_prefill_work = 0
        self._by_priority = self.policy == SchedulingPolicy.PRIORITY
        self._replays_prefix = bool(getattr(self, "prefix_replay_tokens", 0))
        if not policy.follows_vllm_order:
            self.waiting = self._make_queue()
            self.kv_holding_waiting = self._make_queue()
        self._prefill_caps: dict[str, int] | None = None
        self._ahead: tuple[Request, int, int] | None = None
        """The running prefill the last order check found ahead of every waiting
        request, with the queues' change counts then (``_running_order_is_plan_order``)."""
        # vLLM's own hook, bound once: the cap hook runs for every scheduled request.
        self._vllm_reserve = super()._reserve_prefill_lookahead
        self._ranked = config.service == "ranked"
        self._decodes_first = config.decodes_first
        self._tokens_per_decode = 1 + self.num_spec_tokens
        self._decode_cap = (
            decode_cap(config.decode_share, self.max_num_scheduled_tokens,
                       self._tokens_per_decode)
            if config.decode_share > 0 else 0
        )
        self._hidden: list[Request] = []
        self._max_tpot_s = config.decode_share_max_tpot_ms / 1000
        self._decode_start: dict[str, tuple[float, int]] = {}
        """Under a TPOT bound: when each running request was first seen decoding, and
        its output tokens then."""
        listeners = []
        if policy.uses_deadlines:
            listeners.append(self._observe_served)
        self._auto_alpha: AutoAlpha | None = None
        if isinstance(policy, AgingPolicy) and policy.auto_factor is not None:
            self._auto_alpha = AutoAlpha(policy.auto_factor, PrefillRateEstimator())
            listeners.append(self._calibrate_alpha)
        self._chunk_rule = self._make_chunk_rule(config)
        if self._chunk_rule is not None and self._chunk_rule.observes_steps:
            listeners.append(self._chunk_rule.observe_step)
        self._profiler: StepProfiler | None = None
        parallel = vllm_config.parallel_config
        if config.profile.path:
            self._profiler = StepProfiler.for_scheduler(
                self, config.profile, vllm_config, per_engine_path(config.profile.path, parallel))
            listeners.append(self._profiler.on_step)
        trace_path = per_engine_path(config.trace_path, parallel) if config.trace_path else None
        self._steps = (
            StepMonitor(trace_path, listeners,
                        clock=None if self._clock is time.time else self._clock)
            if trace_path or listeners
            else None
        )
        self._log_active(vllm_config)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        max_active = self.max_num_active_reqs
        try:
            self._prepare_step(throttle_prefills)
        except Exception:
            self._undo_step(max_active)  # vLLM's own behaviour for this step
            self._ahead = None
            self._degrade("planning")
        if not self._prefill_caps:
            # vLLM calls the hook for every request it schedules: on a step without caps
            # its own, bound on the instance, saves the override's call layer.
            self._reserve_prefill_lookahead = self._vllm_reserve
        try:
            return super().schedule(throttle_prefills)
        finally:
            self._undo_step(max_active)

    def _prepare_step(self, throttle_prefills: bool) -> None:
        """The plugin's part of a step, before vLLM's loop: refresh, hide, plan."""
        policy = self.fairsched_policy
        self._now = self._clock()
        if policy.dynamic and policy.refresh(self._now, self.get_kv_cache_usage()):
            self.waiting.rekey()
            self.kv_holding_waiting.rekey()
        if self._decode_cap:
            self._hold_newest_decodes(throttle_prefills)
        views = (
            {request.request_id: self._view(request) for request in self.running}
            if self._ranked or policy.orders_decodes
            else {}
        )
        if self._ranked:
            self._hide_unranked(views)
        self._prefill_caps = self._plan_step(views, throttle_prefills)

    def _undo_step(self, max_active: int) -> None:
        """Nothing hidden, capped or limited any more."""
        self._prefill_caps = None
        self.__dict__.pop("_reserve_prefill_lookahead", None)
        self.max_num_active_reqs = max_active
        self.running.extend(self._hidden)
        self._hidden = []

    def _degrade(self, where: str) -> None:
        """Log the exception being handled the first time ``where`` fails, count it
        after that (a failing step repeats every few milliseconds)."""
        count = self._failures.get(where, 0) + 1
        self._failures[where] = count
        if count == 1:
            logger.exception(
                "fairsched: %s failed; this step runs as stock vLLM would, and so will "
                "later steps that fail there (logged once)", where)

    def add_request(self, request: Request) -> None:
        policy = self.fairsched_policy
        if policy.uses_deadlines:
            self._deadlines[request.request_id] = policy.deadline(
                request.arrival_time, self._backlog(), request.num_tokens)
        super().add_request(request)
        if policy.tracks_service:
            policy.observe_arrival(request_view(request))

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.status in COMPLETED:
            self.fairsched_policy.observe_finished(request_view(request))
        if self._chunk_rule is not None:
            self._chunk_rule.forget(request.request_id)
        self._deadlines.pop(request.request_id, None)
        self._cached_prefix.pop(request.request_id, None)
        self._decode_start.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        caps = self._prefill_caps
        if caps:
            # Called for every scheduled request, decodes included: the dict lookup comes
            # first. A cap applies to real prefill work only: never to a decode, nor to a
            # request vLLM padded beyond its work (a new decode padded to 1 + k for
            # speculative decoding must keep every row).
            cap = caps.get(request.request_id)
            if (cap is not None and cap < num_new_tokens
                    and num_new_tokens <= request.num_tokens - num_computed_tokens
                    and has_prefill_work(request, num_computed_tokens)
                    and not request.has_encoder_inputs):
                num_new_tokens = cap
                if cap == 0 and request.status != RequestStatus.RUNNING:
                    self._close_admissions()
        return self._vllm_reserve(request, num_computed_tokens, num_new_tokens)

    def _close_admissions(self) -> None:
        """The plan gave a waiting request nothing: nothing ranked after it is admitted
        this step either. Up to vLLM 0.32 the waiting loop stops at a request the hook
        gives no tokens; from 0.33 it skips it and tries the next one, which the plan
        did not budget for. A limit of the requests running now ends the loop at its
        next check, on every release (``_undo_step`` restores it)."""
        self.max_num_active_reqs = min(self.max_num_active_reqs, len(self.running))

    def _update_request_as_session(self, session: Request, update: Any) -> None:
        """A streaming-input session waiting for its next chunk sits in a waiting queue
        under the key, prefill work and deadline of its last turn, and vLLM extends its
        prompt in place: take it out and queue it again as what it has become (its
        deadline was renewed when the chunk arrived, in :meth:`add_request`)."""
        queue = next((q for q in (self.kv_holding_waiting, self.waiting)
                      if isinstance(q, (PolicyRequestQueue, PriorityLevelQueue))
                      and q.holds(session)), None)
        if queue is not None:
            queue.remove_request(session)
        super()._update_request_as_session(session, update)
        self._cached_prefix.pop(session.request_id, None)
        self._decode_start.pop(session.request_id, None)  # its next turn decodes anew
        if queue is not None:
            queue.add_request(session)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # Its blocks go back to the cache, mostly still holding its prefix: look again
        # when it re-enters the waiting queue (inside vLLM's preemption).
        self._cached_prefix.pop(request.request_id, None)
        return super()._preempt_request(request, *args, **kwargs)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        if self.fairsched_policy.tracks_service:
            for req_id, n in scheduler_output.num_scheduled_tokens.items():
                self.fairsched_policy.observe_service(self.requests[req_id].priority, n)
        if self._steps is None:
            super()._update_after_schedule(scheduler_output)
            return
        try:
            record = self._step_record(scheduler_output)
        except Exception:
            record = None
            self._degrade("the step trace")
        super()._update_after_schedule(scheduler_output)
        if record is None:
            return
        chunks, finished, admitted, extra = record
        try:
            # Positional, in on_dispatch's order: a keyword call costs more, every step.
            self._steps.on_dispatch(
                scheduler_output, chunks, finished, admitted,
                len(self.running) + len(self._hidden),
                len(self.waiting) + len(self.kv_holding_waiting), extra,
            )
        except Exception:
            self._degrade("the step trace")

    def _step_record(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[list[int], list[str], list[str], dict[str, Any] | None]:
        """What the step trace needs from before vLLM advances ``num_computed_tokens``:
        the tokens of each prefill, which requests this step finishes prefilling, who was
        admitted, and the extra fields (profile features, chunk-rule records)."""
        chunks: list[int] = []
        finished: list[str] = []
        lprs_on = self._chunk_rule is not None and self._chunk_rule.params is not None
        batch = BatchStats() if self._profiler is not None or lprs_on else None
        requests = self.requests
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = requests[req_id]
            computed = request.num_computed_tokens
            # has_prefill_work(request, computed), inlined: a call per scheduled
            # request per step, decodes included, costs more than the test.
            if (computed < request.num_prompt_tokens
                    or request.num_tokens - computed > 1):
                chunks.append(n)
                if computed + n >= request.num_tokens:
                    finished.append(req_id)
                if batch is not None:
                    batch.add_prefill(n, computed)
            elif batch is not None:
                batch.add_decode(computed, n)
        extra = None
        if self._profiler is not None:
            extra = self._profiler.features(batch)
        if self._chunk_rule is not None:
            extra = extra or {}
            extra.update(self._chunk_rule.step_record())
            if batch is not None and lprs_on:
                extra.update(self._chunk_rule.dispatched(batch))
        return (chunks, finished,
                [new.req_id for new in scheduler_output.scheduled_new_reqs], extra)

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any):
        if self._steps is not None:
            try:
                self._steps.on_output(scheduler_output)
            except Exception:
                self._degrade("the step trace and its listeners")
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        super().shutdown()
        if self._steps is not None:
            self._steps.close()
        if self._profiler is not None:
            self._profiler.close()

    def _calibrate_alpha(self, step: dict[str, Any]) -> None:
        """Step listener: follow the measured prefill throughput (see policies.auto_alpha).

        Runs from ``update_from_output``, outside ``schedule()``, so re-keying the waiting
        heaps cannot meet an open plan iteration."""
        assert self._auto_alpha is not None
        alpha = self._auto_alpha.observe(step["prefill_tokens"], step["step_time_s"])
        if alpha is None:
            return
        self.fairsched_policy.set_alpha(alpha)
        self.waiting.rekey()
        self.kv_holding_waiting.rekey()
        logger.info(
            "fairsched: automatic alpha %.1f (%.2f x measured prefill %.0f tokens/s)",
            alpha, self._auto_alpha.factor, self._auto_alpha.estimator.rate,
        )

    def _observe_served(self, step: dict[str, Any]) -> None:
        """Step listener for deadline policies: the prefill work each step computed."""
        self.fairsched_policy.observe_step(step["prefill_tokens"])

    def _backlog(self) -> int:
        """Prefill tokens queued: the waiting queues' work and the running prefills' rest
        (as of the last planned step)."""
        return self.waiting.work + self.kv_holding_waiting.work + self._running_prefill_work

    def _deadline(self, request: Request) -> float:
        return self._deadlines.get(request.request_id, math.inf)

    def _view(self, request: Request) -> RequestView:
        view = request_view(request, self._deadline(request), self._cached_tokens(request))
        if self._replays_prefix and request.status != RequestStatus.RUNNING:
            # vLLM rewinds a waiting request's hit by its replay window when it admits
            # it: count the whole prompt (a cap above what vLLM schedules costs nothing).
            view.computed_tokens = 0
        return view

    def _cached_tokens(self, request: Request) -> int:
        """A waiting request's prompt prefix in the prefix cache, as of when it first
        entered the waiting queue or last re-entered it after a preemption (looked up
        then, see :meth:`_lookup_cached`, and kept: re-keying and skipped requests
        coming back cost no lookup); 0 for a request with computed tokens, whose blocks
        are its own."""
        if request.num_computed_tokens > 0:
            return 0
        cached = self._cached_prefix.get(request.request_id)
        if cached is None:
            cached = self._lookup_cached(request)
        return cached

    def _lookup_cached(self, request: Request) -> int:
        """How many of the request's tokens vLLM's waiting loop would find cached now.

        The coordinator's ``find_longest_cache_hit`` is the lookup vLLM's own
        ``get_computed_blocks`` makes, without its side effects (prefix-cache stats, KV
        events, block references); like vLLM it leaves the last token to compute. Not
        under bounded prefix replay (``prefix_replay_tokens``, sliding-window models),
        where vLLM recomputes part of a hit: the whole prompt counts then, and a cap above
        what vLLM schedules costs nothing."""
        manager = self.kv_cache_manager
        cached = 0
        if (self.fairsched_config.prefix_aware and request.num_computed_tokens == 0
                and not self._replays_prefix and _may_read_prefix_cache(manager, request)):
            _blocks, cached, *_ = manager.coordinator.find_longest_cache_hit(
                request.block_hashes,
                _longest_cache_hit(request, getattr(self, "aux_output_connector", None)))
        self._cached_prefix[request.request_id] = cached
        return cached

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """vLLM's cache-aware admission (0.34+, ``cache_aware_admission_window`` with
        prefix caching), under the policy's order.

        Stock vLLM moves the window's requests with a cached prefix to its front. Under a
        policy the key ranks, and a cached prefix is already in it as less remaining
        prefill (``RequestView.remaining_prefill`` counts the uncached part); but it is
        looked up when a request enters the queue, so a prefix cached since (a sibling
        request computed it) still ranks at the whole prompt. Here, on each step where
        KV usage is at least ``cache_aware_admission_threshold``, the first N waiting
        requests in policy order are looked up again, and each whose cached prefix
        changed re-enters the queue under its fresh key. Under ``fcfs`` the queue is
        vLLM's own and stock's reordering runs unchanged."""
        if self.fairsched_policy.follows_vllm_order:
            super()._reorder_waiting_by_cached_prefix()
            return
        if (len(self.waiting) < 2
                or self.kv_cache_manager.usage < self.cache_aware_threshold):
            return
        with closing(self.waiting.iter_in_order()) as ordered:
            head = list(itertools.islice(ordered, self.cache_aware_window))
        for request in head:
            if request.status != RequestStatus.WAITING or request.num_computed_tokens:
                continue
            before = self._cached_prefix.get(request.request_id)
            if self._lookup_cached(request) != before:
                self.waiting.remove_request(request)
                self.waiting.add_request(request)

    def _make_queue(self) -> PolicyRequestQueue | PriorityLevelQueue:
        if self._by_priority:
            return PriorityLevelQueue(self._make_level_queue)
        return self._make_level_queue()

    def _make_level_queue(self) -> PolicyRequestQueue:
        """A queue that keeps each waiting request's view, taken when it enters: its key,
        deadline and work, and a re-key, read that view. The plan builds fresh views
        instead: vLLM can change a waiting request in place (a finished remote KV load
        rewinds its computed tokens before admitting it), and the plan's bounds must be
        exact while a heap key only orders."""
        policy = self.fairsched_policy
        if not policy.uses_deadlines:
            return PolicyRequestQueue(policy.key, snapshot=self._view)
        return PolicyRequestQueue(
            policy.key,
            deadline=_view_deadline,
            clock=lambda: policy.overdue_cutoff(self._now),
            work=_view_work,
            snapshot=self._view,
        )

    def _hide_unranked(self, views: dict[str, RequestView]) -> None:
        """Ranked service: keep in ``self.running`` only the running requests in the top
        ``max_batch_size`` and cap admissions at the waiting ones in it; the rest wait in
        ``self._hidden`` until the step is over (also if anything here fails). Under KV
        pressure the worst-ranked hidden requests are preempted, so the served ones can
        always grow."""
        with closing(self._waiting_views()) as waiting:
            step = ranked_service(
                self.fairsched_policy, views.values(), waiting,
                self.fairsched_config.max_batch_size,
            )
        key = self.fairsched_policy.key
        hidden = [r for r in self.running if r.request_id not in step.served_running]
        hidden.sort(key=lambda request: key(views[request.request_id]))
        self._hidden = hidden
        self.running[:] = [r for r in self.running if r.request_id in step.served_running]
        self.max_num_active_reqs = min(
            self.max_num_active_reqs, len(self.running) + step.admissions
        )
        needed = self._blocks_to_grow()
        while hidden and self.kv_cache_manager.block_pool.get_num_free_blocks() < needed:
            self._preempt_request(
                hidden[-1], time.monotonic(), drop_stale_output=self.requires_kv_delivery
            )
            hidden.pop()

    def _blocks_to_grow(self) -> int:
        """Free KV blocks the requests in ``self.running`` need for a full step: a
        budget's worth of new tokens plus a block each. With fewer free, a request left out
        of the step (hidden, held) would keep blocks vLLM then frees by preempting a
        served one."""
        return -(-self.max_num_scheduled_tokens // self.block_size) + len(self.running)

    def _hold_newest_decodes(self, throttle_prefills: bool) -> None:
        """``decode_share`` (``policies.decode_hold``): while prefill work waits, the last
        decodes in vLLM's running order beyond the cap (the newest: vLLM appends what it
        admits) wait in ``self._hidden`` for this step, and vLLM may admit as many
        requests as before. Nothing is held when vLLM schedules no prefill this step, or
        under KV pressure, where a held decode would keep blocks that vLLM then frees by
        preempting a served request."""
        running = self.running
        decodes = [request for request in running if not request.is_prefill_chunk]
        if self._max_tpot_s:
            for request in decodes:
                self._decode_start.setdefault(
                    request.request_id, (self._now, request.num_output_tokens))
            if any(request.is_prefill_chunk for request in running[:len(decodes)]):
                # A held decode returns behind the step's prefills, where vLLM's loop
                # would leave it without budget after the bound says it must run.
                running[:] = decodes + [r for r in running if r.is_prefill_chunk]
        if len(decodes) <= self._decode_cap:
            return
        if pause_state(self) == PAUSED_ALL or self._defers_prefills(throttle_prefills):
            return
        if self.kv_cache_manager.block_pool.get_num_free_blocks() < self._blocks_to_grow():
            return
        budget = self.max_num_scheduled_tokens
        hold = decodes_to_hold(len(decodes), self._tokens_per_decode,
                               self._prefill_work_within(budget), budget, self._decode_cap)
        held = self._within_tpot(decodes[self._decode_cap:], hold) if hold else []
        if not held:
            return
        ids = {id(request) for request in held}
        self._hidden = [request for request in running if id(request) in ids]
        running[:] = [request for request in running if id(request) not in ids]
        self.max_num_active_reqs -= len(held)

    def _within_tpot(self, holdable: list[Request], hold: int) -> list[Request]:
        """The ``hold`` newest of ``holdable``, or under ``decode_share_max_tpot_ms`` the
        newest of them whose time per output token since their first decode step is
        still below the bound (possibly fewer)."""
        if not self._max_tpot_s:
            return holdable[-hold:]
        now, starts = self._now, self._decode_start
        times = []
        for request in holdable:
            start, tokens = starts[request.request_id]
            times.append((now - start, request.num_output_tokens - tokens))
        return [holdable[i] for i in newest_within_tpot(times, hold, self._max_tpot_s)]

    def _prefill_work_within(self, budget: int) -> int:
        """The prefill tokens this step could schedule, counted up to ``budget``: the
        running prefills' remaining work, then the waiting requests vLLM can admit, in
        the order it meets them, as many as it has free slots for."""
        work = sum(prefill_work(r) for r in self.running if r.is_prefill_chunk)
        slots = free_running_slots(self)
        if work >= budget or slots <= 0:
            return work
        with closing(self._waiting_views()) as waiting:
            for view in waiting:
                work += view.remaining_prefill
                slots -= 1
                if work >= budget or slots == 0:
                    break
        return work

    def _plan_step(self, views: dict[str, RequestView],
                   throttle_prefills: bool = False) -> dict[str, int] | None:
        """Reorder ``self.running`` where asked and return the token caps of its partial
        prefills; None when vLLM's own loop already serves the policy's order, when
        vLLM schedules no prefill this step (everything paused, prefills deferred), or
        when no running prefill is there to cap and no chunk rule decides admissions.

        ``views`` holds the running requests' views when they were needed already; those
        of partial prefills are added here. Decodes are only counted, not viewed, unless
        the order or the chunk rule needs them: a step can carry hundreds."""
        policy = self.fairsched_policy
        rule = self._chunk_rule
        reorder = self._decodes_first or policy.orders_decodes
        if policy.follows_vllm_order and rule is None and not reorder:
            return None
        state = pause_state(self)
        if state == PAUSED_ALL or self._defers_prefills(throttle_prefills):
            return None
        # One pass over the running list, which can hold hundreds of decodes; they are
        # listed only when the order or the plan needs them.
        prefills: list[Request] = []
        decode_after_prefill = False
        for request in self.running:
            if request.is_prefill_chunk:
                prefills.append(request)
            elif prefills:
                decode_after_prefill = True
        if policy.uses_deadlines:
            self._running_prefill_work = sum(map(prefill_work, prefills))
            policy.observe_backlog(self._now, self._backlog())
        if not reorder and rule is None and (
                not prefills
                or not decode_after_prefill
                and self._running_order_is_plan_order(prefills, views, state)):
            return None
        for request in prefills:
            if request.request_id not in views:
                views[request.request_id] = self._view(request)
        rank = step_rank(policy, self._now, self._by_priority)
        decodes = [request for request in self.running if not request.is_prefill_chunk]
        if reorder:
            prefills.sort(key=lambda request: rank(views[request.request_id]))
            if policy.orders_decodes:
                decodes.sort(key=lambda request: rank(views[request.request_id]))
            self.running[:] = decodes + prefills
            if rule is None and not prefills:
                return None
        decode_tokens = self._decode_tokens(decodes)
        if rule is not None:
            rule.begin_step(decode_tokens, self.max_num_active_reqs,
                            self.max_num_scheduled_tokens)
        limits = self._step_limits()
        input_budget = (self.scheduler_config.max_num_batched_tokens
                        - len(decode_tokens) * limits.slot_cost)
        # Closing the generator puts back what it took from the waiting heaps, also
        # when the plan raises.
        with closing(self._waiting_views()) as waiting:
            return plan_prefill_caps(
                policy,
                [views[request.request_id] for request in prefills],
                waiting,
                decode_tokens=sum(n for _ctx, n in decode_tokens),
                token_budget=min(self.max_num_scheduled_tokens, input_budget),
                free_slots=free_running_slots(self),
                free_kv_tokens=self._free_kv_tokens(),
                full_sequence_must_fit=bool(getattr(self, "scheduler_reserve_full_isl", False)),
                rule=rule,
                now=self._now,
                limits=limits,
                by_priority=self._by_priority,
            )

    def _running_order_is_plan_order(self, prefills: list[Request],
                                     views: dict[str, RequestView], state: int) -> bool:
        """Whether vLLM's own loop already gives each running prefill what the plan
        would cap it to, so the plan (and the decode count it needs) can be skipped.

        Without a chunk rule the plan's cap of a running prefill is what is left of the
        budget after the decodes and every better-ranked candidate. vLLM's running loop
        gives the same when it meets the decodes first, then the prefills in rank order,
        and no admissible waiting request ranks above the last of them (the plan
        admits a waiting request first only when it ranks strictly better). This is the
        common light step: one partial prefill behind the decodes, the queue's head
        ranked after it; the check costs a look at that head instead of the whole plan,
        and while :meth:`_still_ahead` vouches for its last answer, nothing.
        ``views`` gets the views the check builds; ``state`` is vLLM's pause state."""
        if self._ahead is not None and self._still_ahead(prefills, state):
            return True
        rank = step_rank(self.fairsched_policy, self._now, self._by_priority)
        for request in prefills:
            if request.request_id not in views:
                views[request.request_id] = self._view(request)
        if len(prefills) == 1:
            last = rank(views[prefills[0].request_id])
        else:
            ranks = [rank(views[request.request_id]) for request in prefills]
            if any(later < earlier for earlier, later in zip(ranks, ranks[1:])):
                return False
            last = ranks[-1]
        head, passed_over = self._first_waiting_rank(rank, state)
        holds = head is None or head > last
        self._ahead = (self._ahead_of_queue(prefills, state)
                       if holds and not passed_over else None)
        return holds

    def _ahead_of_queue(self, prefills: list[Request],
                        state: int) -> tuple[Request, int, int] | None:
        """What :meth:`_still_ahead` needs to vouch for a check that found the one running
        prefill ahead of every waiting request: the prefill and the queues' change
        counts. None where that cannot last: several prefills (their order among
        themselves can change), no prefill computed yet (its view still counts a cached
        prefix), keys that read more than the remaining work, priority levels, a pause,
        or requests holding KV blocks. (Nor when the check passed a waiting request over:
        it may become admissible ahead of the one compared; the caller knows.)"""
        policy = self.fairsched_policy
        if (len(prefills) != 1 or prefills[0].num_computed_tokens == 0
                or not policy.key_follows_remaining_work or self._by_priority
                or state != UNPAUSED or self.kv_holding_waiting):
            return None
        return prefills[0], self.waiting.changes, self.kv_holding_waiting.changes

    def _still_ahead(self, prefills: list[Request], state: int) -> bool:
        """Whether the one running prefill is still ahead of every waiting request.

        Since the last check nothing entered a waiting queue and no key was taken again
        (the change counts): the queues only lost requests, and a waiting request keeps
        its key. The prefill is the one the check found ahead, its key fallen as it
        computed; or that one is done and this one was admitted since, from the head of
        the queue, so ahead of every request left there while its key is at most the
        one it was queued under. What time changes is the deadline lane: a waiting
        request that went overdue outranks the prefill unless the prefill is overdue
        too, with an earlier deadline."""
        prefill, waiting_changes, held_changes = self._ahead
        waiting = self.waiting
        if (len(prefills) != 1 or state != UNPAUSED
                or waiting.changes != waiting_changes
                or self.kv_holding_waiting.changes != held_changes):
            return False
        if prefills[0] is not prefill:
            prefill = prefills[0]
            popped = waiting.last_popped
            if (popped is None or popped[0] is not prefill
                    or prefill.num_computed_tokens == 0
                    or prefill_work(prefill) > popped[1].remaining_prefill):
                return False
            self._ahead = prefill, waiting_changes, held_changes
        policy = self.fairsched_policy
        if not policy.uses_deadlines:
            return True
        cutoff = policy.overdue_cutoff(self._now)
        earliest = waiting.earliest_deadline()
        if earliest > cutoff:
            return True
        own = self._deadline(prefill)
        return own <= cutoff and own < earliest

    def _defers_prefills(self, throttle_prefills: bool) -> bool:
        """vLLM's data-parallel prefill balancing: on a throttled step that is not
        capacity-bound, it defers every prefill while a decode runs."""
        return (throttle_prefills and not getattr(self, "prefill_capacity_bound", False)
                and any(not r.is_prefill_chunk for r in self.running))

    def _step_limits(self) -> ChunkLimits:
        """vLLM's per-request bounds this step: the long-prefill threshold as its loop
        computes it (off for a lone request, floored at a fair share when adaptive)
        and the input budget each scheduled request reserves for drafts."""
        threshold = self.scheduler_config.long_prefill_token_threshold
        if threshold > 0 and self.fairsched_surface.threshold_spares_lone_request:
            num_running, num_waiting = self.get_request_counts()
            eligible = num_running + num_waiting
            if eligible <= 1:
                threshold = 0
            elif getattr(self, "adaptive_long_prefill_threshold", False):
                threshold = max(threshold,
                                self.scheduler_config.max_num_batched_tokens // eligible)
        spec = self.vllm_config.speculative_config
        slots = getattr(spec, "max_num_new_slots_for_drafting", 0) if spec is not None else 0
        return ChunkLimits(chunk_limit=threshold, slot_cost=slots)

    def _waiting_views(self) -> Generator[RequestView, None, None]:
        """The waiting requests vLLM's waiting loop can admit this step, in the order it
        will meet them (``adapter.admission``; under ``fcfs`` the queues are vLLM's own,
        whose iteration is that order)."""
        loras = LoraSlots.of(self)
        view = self._view
        for queue in admitting_queues(self):
            if not queue:  # usually the KV-holding queue: no iterator to set up
                continue
            if not isinstance(queue, (PolicyRequestQueue, PriorityLevelQueue)):
                for request in queue:
                    if admissible(self, request, loras):
                        yield view(request)
                continue
            with closing(queue.iter_in_order()) as requests:
                for request in requests:
                    if admissible(self, request, loras):
                        yield view(request)

    def _first_waiting_rank(self, rank: Callable[[RequestView], Rank],
                            state: int) -> tuple[Rank | None, bool]:
        """The rank of what :meth:`_waiting_views` yields first, and whether a waiting
        request ahead of it was passed over as not admissible. In the common case, an
        admissible head of the first non-empty queue, it is read without setting up the
        ordered iteration, and from the key it is queued under when it is not overdue
        (no view to build: the key is the one the queue will serve it by)."""
        for queue in admitting_queues(self, state):
            if queue:
                if isinstance(queue, PolicyRequestQueue):
                    head, key = queue.peek_keyed()
                else:
                    head, key = queue.peek_request(), None
                if admissible(self, head, LoraSlots.of(self)):
                    if key is not None:
                        return self.fairsched_policy.rank_of_key(key), False
                    return rank(self._view(head)), False
                break
        else:
            return None, False  # nothing waits
        with closing(self._waiting_views()) as waiting:
            head = next(waiting, None)
        return (None if head is None else rank(head)), True

    def _decode_tokens(self, decodes: list[Request]) -> list[tuple[int, int]]:
        """``(context length, tokens)`` of each decode vLLM's running loop will serve (1
        plus speculative tokens), leaving out, as vLLM does, a request whose in-flight
        step already reaches ``max_tokens`` (async scheduling) and one whose previous
        decode is still in the pipeline (pipeline parallelism)."""
        out = []
        append = out.append
        step = self.current_step + 1  # schedule() counts the step before its loop
        for r in decodes:
            placeholders = r.num_output_placeholders
            computed = r.num_computed_tokens
            if (
                placeholders > 0
                and computed + 2 - placeholders >= r.num_prompt_tokens + r.max_tokens
            ):
                continue
            if step < getattr(r, "next_decode_eligible_step", 0):
                continue
            append((computed, max(r.num_tokens_with_spec + placeholders - computed, 0)))
        return out

    def _make_chunk_rule(self, config: FairschedConfig) -> LatencyChunkRule | None:
        """LPRS, APC and alignment, when any is on; the latency model is loaded and
        checked now, so a missing or mismatched model stops start-up."""
        from vllm.platforms import current_platform

        align = config.lprs.align == "on" or (
            config.lprs.align == "auto" and current_platform.device_type == "npu"
        )
        if not (config.lprs.enabled or config.apc.enabled or align):
            return None
        predictor = memory = None
        if config.lprs.enabled:
            memory = make_memory_provider(config.profile.memory, kv_state_reader(self))
            predictor = LatencyPredictor.from_config(config.predictor, memory.name)
        return LatencyChunkRule(config.lprs, config.apc, predictor, memory, self.block_size,
                                align)

    def _free_kv_tokens(self) -> int:
        manager = self.kv_cache_manager
        free_blocks = manager.block_pool.get_num_free_blocks()
        free_blocks -= getattr(manager, "watermark_blocks", 0)
        return max(free_blocks, 0) * self.block_size

    def _log_active(self, vllm_config: Any) -> None:
        from vllm.platforms import current_platform

        mode_is_async = isinstance(self, AsyncScheduler)
        policy = self.fairsched_policy.describe()
        if self._ranked:
            policy += f", ranked service (max_batch_size={self.fairsched_config.max_batch_size})"
        if self._decode_cap:
            policy += (f", decodes held to {self._decode_cap} per step while prefill work "
                       f"waits (decode_share={self.fairsched_config.decode_share:g})")
            if self._max_tpot_s:
                policy += (", none held beyond "
                           f"{self.fairsched_config.decode_share_max_tpot_ms:g} ms per output "
                           "token")
        logger.info(
            "fairsched: scheduler %s active with policy %s (vLLM %s, platform %s, "
            "%s scheduling)",
            type(self).__qualname__,
            policy,
            vllm.__version__,
            current_platform.device_type,
            "async" if mode_is_async else "sync",
        )
        wants_async = bool(vllm_config.scheduler_config.async_scheduling)
        if wants_async != mode_is_async:
            logger.warning(
                "fairsched: vLLM runs with async_scheduling=%s but %s is the %s variant; "
                "use --scheduler-cls fairsched_plugin.FairScheduler, which follows the mode",
                wants_async,
                type(self).__qualname__,
                "async" if mode_is_async else "sync",
            )


class FairScheduler(FairSchedulingMixin, AsyncScheduler):
    """The class to name in ``--scheduler-cls``: async, or sync when vLLM runs sync.

    vLLM uses a custom class as given whatever its scheduling mode, and decides the mode
    after the command line (the CPU executor, for one, turns async scheduling off). So
    constructing this class in a sync engine builds a :class:`FairSyncScheduler` instead;
    one name is right in both modes.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Scheduler:
        scheduler_config = _vllm_config_of(args, kwargs).scheduler_config
        if cls is FairScheduler and not scheduler_config.async_scheduling:
            return FairSyncScheduler(*args, **kwargs)
        return super().__new__(cls)


class FairSyncScheduler(FairSchedulingMixin, Scheduler):
    """The sync variant (``--no-async-scheduling``, CPU, PP on model runner V1)."""
