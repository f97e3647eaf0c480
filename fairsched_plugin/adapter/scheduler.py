"""vLLM scheduler subclasses that order requests by a fairsched policy.

vLLM's ``schedule()`` is wrapped, never copied. A step's phases, numbered as everywhere
in the package (the plan's own stages are 4.1-4.6, ``policies.plan``):

1. the policy refreshes the online state its keys read (output-length estimates, tier
   service, KV pressure); when that changed, the waiting heaps are re-keyed;
2. with ``service: ranked`` (the ordering-policies paper's semantics), only the top
   ``max_batch_size`` requests by key, running and waiting together, are served: running requests
   outside the top are hidden from vLLM's loop for the step (keeping their KV cache) and admissions
   are capped at the waiting requests inside it; with ``decode_share``, while prefill
   work waits, the newest decodes beyond that share of the budget are hidden the same
   way (``policies.decode_hold``);
3. with ``decodes_first`` (the chunked-prefill paper's service), or a policy that orders decodes,
   the running list is reordered in place: decodes first (by key, except under policies that
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

``fcfs`` is vLLM's own order, so phases 3 and 4 are skipped for it: it is an exact
control arm against stock vLLM. A policy with deadlines (the guarded ones) gets each
request's deadline when it arrives, from the prefill work queued ahead of it and the recent
backlog, counted in served prefill tokens; its queues keep the overdue lane in a second heap.

vLLM's FCFS preemption takes ``running[-1]``: in vLLM's running order the most recently
admitted request; with the reorder, the lowest-ranked partial prefill or, when none is
running, the last decode.

With a ``trace_path``, the automatic Aging alpha or ``profile.path``, a step monitor
also measures every step and feeds the trace file, the alpha calibration and the
predictor profile (``adapter.step_trace``).

Here: the classes vLLM is given, the wrapped ``schedule()`` (phases 1 and 5, and undoing
the step), and the per-request hooks. The rest has a module each: start-up in
``startup``, phase 2 in ``held_requests``, phases 3 and 4 in ``step_plan``, the policy's
view of a request in ``request_views``, the step trace in ``step_trace``.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from ..policies.alignment import align_chunk
from .held_requests import HeldRequests
from .metrics_hooks import MetricsHooks
from .queue import PolicyRequestQueue, PriorityLevelQueue
from .request_views import RequestViews, has_prefill_work, request_view
from .startup import SchedulerStartUp, vllm_config_of
from .step_plan import StepPlanning
from .step_trace import StepTrace

logger = logging.getLogger("vllm.fairsched")

COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
"""Finished on their own: their output length is a sample for the estimators (an aborted
request's is not)."""


class FairSchedulingMixin(StepTrace, MetricsHooks, HeldRequests, StepPlanning, RequestViews,
                          SchedulerStartUp):
    """Policy-ordered prefills for any vLLM ``Scheduler`` subclass (see module docstring)."""

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
                self._clock(), self._backlog(), request.num_tokens, request.request_id)
        super().add_request(request)
        if policy.tracks_service:
            policy.observe_arrival(request_view(request))
        if self._metrics is not None:
            self._metrics_on_arrival(request)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.status in COMPLETED:
            self.fairsched_policy.observe_finished(request_view(request))
        if self._chunk_rule is not None:
            self._chunk_rule.forget(request.request_id)
        if self._deadlines.pop(request.request_id, None) is not None:
            self.fairsched_policy.forget_request(request.request_id,
                                                 request.num_output_tokens)
        self._cached_prefix.pop(request.request_id, None)
        self._decode_start.pop(request.request_id, None)
        freed = super()._free_request(request, *args, **kwargs)
        if self._metrics is not None:
            self._metrics_on_free(request)
        return freed

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
            if cap is None and self._aligned_block:
                # A prefill the plan did not reach takes the budget left, as in stock
                # vLLM, but still ends on a KV block boundary (alignment is on).
                cap = align_chunk(num_computed_tokens, num_new_tokens,
                                  request.num_tokens - num_computed_tokens,
                                  self._aligned_block)
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
        if self.fairsched_policy.running_first and request.request_id in self._deadlines:
            # vLLM puts a preempted request back at the front of its waiting queue: it
            # resumes before every waiting request, the last preempted first.
            self._preemptions += 1
            self._deadlines[request.request_id] = -float(self._preemptions)
        return super()._preempt_request(request, *args, **kwargs)

    def _backlog(self) -> int:
        """Prefill tokens queued: the waiting queues' work and the running prefills' rest
        (as the deadline policy's guard keeps it: taken at the last planned step, plus
        what was admitted since, less what was scheduled since)."""
        running = self.fairsched_policy.admission_guard.ahead
        return self.waiting.work + self.kv_holding_waiting.work + running


class FairScheduler(FairSchedulingMixin, AsyncScheduler):
    """The class to name in ``--scheduler-cls``: async, or sync when vLLM runs sync.

    vLLM uses a custom class as given whatever its scheduling mode, and decides the mode
    after the command line (the CPU executor, for one, turns async scheduling off). So
    constructing this class in a sync engine builds a :class:`FairSyncScheduler` instead;
    one name is right in both modes.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Scheduler:
        scheduler_config = vllm_config_of(args, kwargs).scheduler_config
        if cls is FairScheduler and not scheduler_config.async_scheduling:
            return FairSyncScheduler(*args, **kwargs)
        return super().__new__(cls)


class FairSyncScheduler(FairSchedulingMixin, Scheduler):
    """The sync variant (``--no-async-scheduling``, CPU, PP on model runner V1)."""
