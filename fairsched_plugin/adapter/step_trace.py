"""What a step reports once dispatched and once its output is back.

The policy learns each tier's service; with a ``trace_path``, the automatic Aging alpha,
a deadline policy, LPRS's bias or guard, or ``profile.path``, a :class:`StepMonitor`
measures every step, from ``_update_after_schedule`` (dispatch) to ``update_from_output``
(output back), and feeds the trace file and its listeners: the alpha calibration, the
served prefill work of deadline policies, the chunk rule and the predictor profile (the
batch's 11 raw features and its measured time per row).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput

from ..policies.tail_watch import TailWatch
from ..predictor.features import BatchStats
from .steps import StepMonitor

logger = logging.getLogger("vllm.fairsched")


class StepTrace:
    """The step monitor's hooks and listeners (part of ``scheduler.FairSchedulingMixin``)."""

    _steps: StepMonitor | None = None
    """Set at start-up; the class default keeps ``update_from_output`` working on a
    scheduler built without it (vLLM's own tests build one with ``object.__new__``)."""
    _tail_watch: TailWatch | None = None

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        if self._metrics is not None:
            self._metrics_on_schedule(scheduler_output)
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
        if self.fairsched_policy.uses_deadlines:
            # Counted as scheduled, when vLLM also counts the tokens computed (and the work
            # ahead of the queue shrinks by as much): the same instant in sync and async.
            self.fairsched_policy.observe_step(sum(chunks), self._now, finished)
            watch = self._tail_watch
            if watch is not None and watch.step_backs != self._step_backs_logged:
                self._log_step_back(watch)
        try:
            # Positional, in on_dispatch's order: a keyword call costs more, every step.
            self._steps.on_dispatch(
                scheduler_output, chunks, finished, admitted,
                len(self.running) + len(self._hidden),
                len(self.waiting) + len(self.kv_holding_waiting), extra,
            )
        except Exception:
            self._degrade("the step trace")

    def _log_step_back(self, watch: TailWatch) -> None:
        """The guard lowered its gain: said at the first step-back, then counted only
        (``fairsched:guard_step_backs``)."""
        if self._step_backs_logged == 0:
            logger.warning(
                "fairsched: the %s tail of the last requests was %.2fx FCFS's estimate on "
                "this engine, so the guard steps back towards arrival order (gain %.2f); "
                "it probes back while the tail holds (logged once, counted in "
                "fairsched:guard_step_backs)", watch.last_measure, watch.last_ratio,
                watch.gain)
        self._step_backs_logged = watch.step_backs

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
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._metrics is not None:
            self._metrics_after_output()
        return outputs

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
