"""vLLM scheduler subclasses that order requests by a fairsched policy.

vLLM's ``schedule()`` is wrapped, never copied. Per step:

1. the policy refreshes the online state its keys read (output-length estimates, tier
   service, KV pressure); when that changed, the waiting heaps are re-keyed;
2. with ``service: ranked`` (the seed-002 semantics), only the top ``max_batch_size``
   requests by key, running and waiting together, are served: running requests outside the
   top are hidden from vLLM's loop for the step (keeping their KV cache) and admissions
   are capped at the waiting requests inside it;
3. with ``decodes_first`` (seed 000's service), or a policy that orders decodes, the
   running list is reordered in place: decodes first (by key, except under policies that
   keep vLLM's admission order), then partial prefills by rank, best first; otherwise
   vLLM's running order stays as it is;
4. the plan (``policies.plan_prefill_caps``) gives each running partial prefill the tokens
   the residual budget leaves it once the decodes and every better-ranked candidate,
   waiting requests included, have taken their share (the caps add up to the budget, so
   the running order does not change who gets what);
5. vLLM's own ``schedule()`` runs; its per-request hook ``_reserve_prefill_lookahead``
   returns ``min(n, cap)`` for running partial prefills (0 skips one for this step), and
   the waiting queue, a heap on the same key, admits in policy order.

``fcfs`` is vLLM's own order, so steps 3 and 4 are skipped for it: it is an exact
control arm against stock vLLM. A policy with deadlines (``guarded-srpf``) gets each
request's deadline when it arrives, from the prefill work queued ahead of it, the recent
backlog and the measured prefill rate; its queues keep the overdue lane in a second heap.

vLLM's FCFS preemption takes ``running[-1]``: in vLLM's running order the most recently
admitted request; with the reorder, the lowest-ranked partial prefill or, when none is
running, the last decode.

With a ``trace_path``, the automatic Aging alpha or ``profile.path``, a
:class:`StepMonitor` also measures every step, from ``_update_after_schedule`` (dispatch)
to ``update_from_output`` (output back), and feeds the trace file, the alpha calibration
and the predictor profile (the batch's 11 raw features and its measured time per row).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Generator
from contextlib import closing
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from ..config import AUTO, FairschedConfig, load_config
from ..predictor.features import BatchStats
from ..predictor.memory import make_memory_provider
from ..predictor.runtime import LatencyPredictor
from ..policies import (
    AutoAlpha,
    PrefillRateEstimator,
    RequestView,
    make_policy,
    plan_prefill_caps,
    ranked_service,
)
from .compat import check_scheduler_hooks, check_scheduler_state, check_vllm_version
from .chunking import LatencyChunkRule
from .profiling import StepProfiler, kv_state_reader
from .queue import PolicyRequestQueue
from .steps import StepMonitor

# A child of "vllm": start-up lines appear in vLLM's own log stream and format.
logger = logging.getLogger("vllm.fairsched")

COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
"""Finished on their own: their output length is a sample for the estimators (an aborted
request's is not)."""


def request_view(request: Request, deadline: float = math.inf) -> RequestView:
    """The policy layer's copy of a vLLM request."""
    return RequestView(
        request_id=request.request_id,
        arrival_time=request.arrival_time,
        prompt_tokens=request.num_prompt_tokens,
        computed_tokens=request.num_computed_tokens,
        output_tokens=request.num_output_tokens,
        max_tokens=request.max_tokens,
        priority=request.priority,
        deadline=deadline,
    )


def prefill_work(request: Request) -> int:
    """Tokens a waiting or running request still has to prefill."""
    return max(request.num_tokens - request.num_computed_tokens, 0)


def has_prefill_work(request: Request, num_computed_tokens: int) -> bool:
    """More than one token left to compute: a (re)prefill, not a decode step.

    A decode computes the one token sampled last; under async scheduling its in-flight
    token is already counted, leaving zero. Speculative tokens are not in ``num_tokens``.
    """
    return request.num_tokens - num_computed_tokens > 1


def _vllm_config_of(args: tuple, kwargs: dict) -> Any:
    """vLLM passes constructor arguments by keyword; accept the first positional too."""
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


class FairSchedulingMixin:
    """Policy-ordered prefills for any vLLM ``Scheduler`` subclass (see module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ``clock``: what "now" is for the policy (ages, deadlines) and the step monitor;
        # the simulator passes its virtual clock, a server the wall clock.
        self._clock: Callable[[], float] = kwargs.pop("clock", None) or time.time
        check_vllm_version(vllm.__version__)
        check_scheduler_hooks(Scheduler)
        vllm_config = _vllm_config_of(args, kwargs)
        config = self.fairsched_config = load_config(vllm_config.additional_config)
        self.fairsched_policy = make_policy(config, epoch=self._clock())
        super().__init__(*args, **kwargs)
        check_scheduler_state(self)
        policy = self.fairsched_policy
        self._now = self._clock()
        self._deadlines: dict[str, float] = {}
        self._running_prefill_work = 0
        if not policy.follows_vllm_order:
            self.waiting = self._make_queue()
            self.kv_holding_waiting = self._make_queue()
        self._prefill_caps: dict[str, int] | None = None
        self._ranked = config.service == "ranked"
        self._decodes_first = config.decodes_first
        self._hidden: list[Request] = []
        listeners = []
        if policy.uses_deadlines:
            listeners.append(self._observe_prefill_rate)
        self._auto_alpha: AutoAlpha | None = None
        if config.policy == "aging" and config.aging.alpha == AUTO:
            self._auto_alpha = AutoAlpha(config.aging.auto_factor, PrefillRateEstimator())
            listeners.append(self._calibrate_alpha)
        self._chunk_rule = self._make_chunk_rule(config)
        if self._chunk_rule is not None and self._chunk_rule.observes_steps:
            listeners.append(self._chunk_rule.observe_step)
        self._profiler: StepProfiler | None = None
        if config.profile.path:
            self._profiler = StepProfiler.for_scheduler(self, config.profile, vllm_config)
            listeners.append(self._profiler.on_step)
        self._steps = (
            StepMonitor(config.trace_path, listeners,
                        clock=None if self._clock is time.time else self._clock)
            if config.trace_path or listeners
            else None
        )
        self._log_active(vllm_config)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        policy = self.fairsched_policy
        self._now = self._clock()
        if policy.dynamic and policy.refresh(self._now, self.get_kv_cache_usage()):
            self.waiting.rekey()
            self.kv_holding_waiting.rekey()
        views = (
            {request.request_id: self._view(request) for request in self.running}
            if self._ranked or policy.orders_decodes
            else {}
        )
        max_active = self.max_num_active_reqs
        try:
            if self._ranked:
                self._hidden = self._hide_unranked(views)
            self._prefill_caps = self._plan_step(views)
            return super().schedule(throttle_prefills)
        finally:
            self._prefill_caps = None
            self.max_num_active_reqs = max_active
            self.running.extend(self._hidden)
            self._hidden = []

    def add_request(self, request: Request) -> None:
        policy = self.fairsched_policy
        if policy.uses_deadlines:
            self._deadlines[request.request_id] = policy.deadline(request.arrival_time,
                                                                  self._backlog())
        super().add_request(request)
        if policy.tracks_service:
            policy.observe_arrival(request_view(request))

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.status in COMPLETED:
            self.fairsched_policy.observe_finished(request_view(request))
        if self._chunk_rule is not None:
            self._chunk_rule.forget(request.request_id)
        self._deadlines.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        caps = self._prefill_caps
        if caps is not None:
            # Called for every scheduled request, decodes included: the dict lookup comes
            # before the (property) encoder check, which only planned requests need.
            cap = caps.get(request.request_id)
            if cap is not None:
                if not request.has_encoder_inputs:
                    num_new_tokens = min(num_new_tokens, cap)
            elif (self._chunk_rule is not None and request.status != RequestStatus.RUNNING
                  and not request.has_encoder_inputs):
                num_new_tokens = 0  # a chunk rule's plan is exclusive: not planned, not admitted
        return super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        if self.fairsched_policy.tracks_service:
            for req_id, n in scheduler_output.num_scheduled_tokens.items():
                self.fairsched_policy.observe_service(self.requests[req_id].priority, n)
        if self._steps is None:
            super()._update_after_schedule(scheduler_output)
            return
        # Before vLLM advances num_computed_tokens: which requests were prefilling, and
        # which of them this step finishes.
        prefill_ids: set[str] = set()
        finished: list[str] = []
        lprs_on = self._chunk_rule is not None and self._chunk_rule.params is not None
        batch = BatchStats() if self._profiler is not None or lprs_on else None
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            computed = request.num_computed_tokens
            if has_prefill_work(request, computed):
                prefill_ids.add(req_id)
                if computed + n >= request.num_tokens:
                    finished.append(req_id)
                if batch is not None:
                    batch.add_prefill(n, computed)
            elif batch is not None:
                batch.add_decode(computed, n)
        extra = self._profiler.features(batch) if self._profiler is not None else {}
        if self._chunk_rule is not None:
            extra.update(self._chunk_rule.step_record())
            if batch is not None and lprs_on:
                extra.update(self._chunk_rule.dispatched(batch))
        super()._update_after_schedule(scheduler_output)
        self._steps.on_dispatch(
            scheduler_output,
            prefill_ids,
            finished,
            [new.req_id for new in scheduler_output.scheduled_new_reqs],
            num_running=len(self.running) + len(self._hidden),
            num_waiting=len(self.waiting) + len(self.kv_holding_waiting),
            extra=extra,
        )

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any):
        if self._steps is not None:
            self._steps.on_output(scheduler_output)
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

    def _observe_prefill_rate(self, step: dict[str, Any]) -> None:
        """Step listener for deadline policies: the prefill rate of saturated steps, those
        that used the whole budget or left requests waiting."""
        saturated = (step["num_waiting"] > 0 or step["prefill_tokens"] + step["decode_tokens"]
                     >= self.max_num_scheduled_tokens)
        self.fairsched_policy.observe_step(step["prefill_tokens"], step["step_time_s"],
                                           saturated)

    def _backlog(self) -> int:
        """Prefill tokens queued: the waiting queues' work and the running prefills' rest
        (as of the last planned step)."""
        return self.waiting.work + self.kv_holding_waiting.work + self._running_prefill_work

    def _deadline(self, request: Request) -> float:
        return self._deadlines.get(request.request_id, math.inf)

    def _view(self, request: Request) -> RequestView:
        return request_view(request, self._deadline(request))

    def _make_queue(self) -> PolicyRequestQueue:
        if not self.fairsched_policy.uses_deadlines:
            return PolicyRequestQueue(self._waiting_key)
        return PolicyRequestQueue(
            self._waiting_key,
            deadline=self._deadline,
            clock=lambda: self._now,
            work=prefill_work,
        )

    def _waiting_key(self, request: Request):
        return self.fairsched_policy.key(self._view(request))

    def _hide_unranked(self, views: dict[str, RequestView]) -> list[Request]:
        """Ranked service: keep in ``self.running`` only the running requests in the top
        ``max_batch_size``, cap admissions at the waiting ones in it, and return the rest
        (put back after the step). Under KV pressure the worst-ranked hidden requests are
        preempted, so the served ones can always grow."""
        with closing(self._waiting_views()) as waiting:
            step = ranked_service(
                self.fairsched_policy, views.values(), waiting,
                self.fairsched_config.max_batch_size,
            )
        key = self.fairsched_policy.key
        hidden = [r for r in self.running if r.request_id not in step.served_running]
        hidden.sort(key=lambda request: key(views[request.request_id]))
        self.running[:] = [r for r in self.running if r.request_id in step.served_running]
        self.max_num_active_reqs = min(
            self.max_num_active_reqs, len(self.running) + step.admissions
        )
        needed = -(-self.max_num_scheduled_tokens // self.block_size) + len(self.running)
        while hidden and self.kv_cache_manager.block_pool.get_num_free_blocks() < needed:
            victim = hidden.pop()
            self._preempt_request(
                victim, time.monotonic(), drop_stale_output=self.requires_kv_delivery
            )
        return hidden

    def _plan_step(self, views: dict[str, RequestView]) -> dict[str, int] | None:
        """Reorder ``self.running`` where asked and return the token caps of its partial
        prefills; None when vLLM's own loop already serves the policy's order.

        ``views`` holds the running requests' views when they were needed already; those
        of partial prefills are added here. Decodes are only counted, not viewed, unless
        the order or the chunk rule needs them: a step can carry hundreds."""
        policy = self.fairsched_policy
        rule = self._chunk_rule
        reorder = self._decodes_first or policy.orders_decodes
        if policy.follows_vllm_order and rule is None and not reorder:
            return None
        prefills = [r for r in self.running if r.is_prefill_chunk]
        if policy.uses_deadlines:
            self._running_prefill_work = sum(prefill_work(r) for r in prefills)
            policy.observe_backlog(self._now, self._backlog())
        for request in prefills:
            if request.request_id not in views:
                views[request.request_id] = self._view(request)
        rank = policy.ranker(self._now)
        prefills.sort(key=lambda request: rank(views[request.request_id]))
        decodes: list[Request] | None = None
        if reorder or rule is not None:
            decodes = [r for r in self.running if not r.is_prefill_chunk]
        if reorder:
            assert decodes is not None
            if policy.orders_decodes:
                decodes.sort(key=lambda request: rank(views[request.request_id]))
            self.running[:] = decodes + prefills
        if rule is None and not prefills:
            return {}
        if rule is not None:
            assert decodes is not None
            decode_tokens = self._decode_tokens(decodes)
            rule.begin_step(decode_tokens, self.max_num_active_reqs,
                            self.max_num_scheduled_tokens)
            decode_total = sum(n for _ctx, n in decode_tokens)
        else:
            # An upper bound: a decode takes one token plus at most num_spec_tokens drafts.
            # Over-reserving only leaves budget to vLLM's waiting loop.
            decode_total = (len(self.running) - len(prefills)) * (1 + self.num_spec_tokens)
        # Closing the generator puts back what it took from the waiting heaps, also
        # when the plan raises.
        with closing(self._waiting_views()) as waiting:
            return plan_prefill_caps(
                policy,
                [views[request.request_id] for request in prefills],
                waiting,
                decode_tokens=decode_total,
                token_budget=self.max_num_scheduled_tokens,
                free_slots=self.max_num_active_reqs - len(self.running),
                free_kv_tokens=self._free_kv_tokens(),
                full_sequence_must_fit=bool(getattr(self, "scheduler_reserve_full_isl", False)),
                rule=rule,
                now=self._now,
            )

    def _waiting_views(self) -> Generator[RequestView, None, None]:
        """Waiting candidates in the order vLLM's waiting loop will meet them (under
        ``fcfs`` the queues are vLLM's own, whose iteration is that order)."""
        for queue in (self.kv_holding_waiting, self.waiting):
            if not isinstance(queue, PolicyRequestQueue):
                yield from map(self._view, queue)
                continue
            with closing(queue.iter_in_order()) as requests:
                for request in requests:
                    yield self._view(request)

    @staticmethod
    def _decode_tokens(decodes: list[Request]) -> list[tuple[int, int]]:
        """``(context length, tokens)`` of each decode vLLM's running loop will serve (1
        plus speculative tokens), leaving out, as vLLM does under async scheduling, a
        request whose in-flight step already reaches ``max_tokens``."""
        out = []
        for r in decodes:
            placeholders = r.num_output_placeholders
            if (
                placeholders > 0
                and r.num_computed_tokens + 2 - placeholders >= r.num_prompt_tokens + r.max_tokens
            ):
                continue
            tokens = max(r.num_tokens_with_spec + placeholders - r.num_computed_tokens, 0)
            out.append((r.num_computed_tokens, tokens))
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
        if self._auto_alpha is not None:
            policy = (
                f"aging(alpha=auto: {self._auto_alpha.factor:g} x measured prefill tokens/s, "
                f"arrival order until measured, beta={self.fairsched_config.aging.beta:g})"
            )
        if self._ranked:
            policy += f", ranked service (max_batch_size={self.fairsched_config.max_batch_size})"
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
