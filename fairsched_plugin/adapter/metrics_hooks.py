"""Where the scheduler reports to its metrics recorder (part of
``scheduler.FairSchedulingMixin``).

Arrivals come from ``add_request``, first admissions from ``_update_after_schedule``,
requests that never got a step from ``_free_request``, and LPRS, APC and the served work
from the step monitor's records when a monitor runs anyway (a monitor is never started
for metrics alone: counting steps costs nothing, timing them does). The snapshot is
written at most every ``metrics.interval_s`` and whenever the engine falls idle, so the
last figures of a burst are always on disk. A failure here degrades like any other
plugin work: the step runs as stock vLLM's and the place is counted.
"""

from __future__ import annotations

import atexit
import math
import time
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

from ..config import KEYS, FairschedConfig, key_value, parse_class_edges, resolve_auto_switches
from ..metrics.recorder import MetricsRecorder
from ..metrics.snapshot import snapshot_path, write_snapshot
from ..policies.aging import AgingPolicy
from .startup import engine_index


def _remove_at_exit(path: Path) -> None:
    """An engine that has exited has no live figures: its snapshot goes with it."""
    atexit.register(lambda: path.unlink(missing_ok=True))


class MetricsHooks:
    """The recorder's inputs and the snapshot file."""

    _metrics: MetricsRecorder | None = None
    """None with ``metrics.enabled`` false, and on a scheduler built without start-up
    (vLLM's own tests build one with ``object.__new__``)."""

    def _start_metrics(self, vllm_config: Any, description: str,
                       listeners: list[Any] | None) -> None:
        """Called from start-up before the step monitor is built; ``listeners`` is its
        list when a monitor will run, None when not."""
        config = self.fairsched_config.metrics
        if not config.enabled:
            return
        self._metrics = MetricsRecorder(parse_class_edges(config.class_edges))
        engine = engine_index(vllm_config.parallel_config)
        self._metrics_path = snapshot_path(config.dir, vllm_config.instance_id, engine)
        self._metrics_header = {
            "engine": engine,
            "model_name": vllm_config.model_config.served_model_name,
            "policy": {
                "name": self.fairsched_config.policy,
                "description": description,
                "settings": self._non_default_settings(),
            },
        }
        self._metrics_interval = config.interval_s
        self._metrics_written = float("-inf")
        self._metrics_idle = True
        if listeners is not None:
            listeners.append(self._record_step)
        self._write_metrics(self._clock())
        _remove_at_exit(self._metrics_path)

    def _non_default_settings(self) -> dict[str, str]:
        # The "auto" switches resolve by policy: compare with their value under this one.
        defaults = resolve_auto_switches(FairschedConfig(policy=self.fairsched_config.policy))
        out = {}
        for key in KEYS:
            value = key_value(self.fairsched_config, key.path)
            if value != key_value(defaults, key.path):
                out[key.path] = str(value)
        return out

    def _metrics_on_arrival(self, request: Request) -> None:
        # A request given its deadline at gain 0 is due at once, to go in arrival order:
        # that deadline orders, it promises nothing to count as overdue.
        watch = self._tail_watch
        promised = watch is None or watch.gain > 0
        try:
            self._metrics.on_arrival(
                request.request_id, request.arrival_time, request.num_prompt_tokens,
                request.priority,
                self._deadlines.get(request.request_id) if promised else None)
        except Exception:
            self._degrade("the metrics")

    def _metrics_on_schedule(self, scheduler_output: SchedulerOutput) -> None:
        try:
            if scheduler_output.scheduled_new_reqs:
                now = self._clock()
                policy = self.fairsched_policy
                served = policy.served_work(now) if policy.uses_deadlines else None
                self._metrics.on_scheduled(
                    [new.req_id for new in scheduler_output.scheduled_new_reqs], now, served)
            if self._steps is None:
                self._metrics.count_step()
        except Exception:
            self._degrade("the metrics")

    def _metrics_on_free(self, request: Request) -> None:
        try:
            self._metrics.on_finished(request.request_id)
            self._write_metrics_when_due(self._clock())
        except Exception:
            self._degrade("the metrics")

    def _metrics_after_output(self) -> None:
        try:
            self._write_metrics_when_due(self._clock())
        except Exception:
            self._degrade("the metrics")

    def _write_metrics_when_due(self, now: float) -> None:
        """Write when the interval has passed, or when the engine has just run out of
        work (once: an idle engine core stops stepping, but a driver may not)."""
        idle = not (self.running or self.waiting or self.kv_holding_waiting)
        if now - self._metrics_written >= self._metrics_interval or (
                idle and not self._metrics_idle):
            self._write_metrics(now)
        self._metrics_idle = idle

    def _record_step(self, record: dict[str, Any]) -> None:
        """Step listener (output back)."""
        policy = self.fairsched_policy
        now = self._clock()
        self._metrics.on_step(
            record, policy.served_work(now) if policy.uses_deadlines else None, now)

    def _write_metrics(self, now: float) -> None:
        policy = self.fairsched_policy
        rule = self._chunk_rule
        lprs_on = rule is not None and rule.params is not None
        document = self._metrics.snapshot(
            now, time.time(), self._metrics_header, self._failures,
            has_deadlines=policy.uses_deadlines,
            lprs_state=({"target_ms": (rule.params.target_ms
                                       if math.isfinite(rule.params.target_ms) else None),
                         "bias_ms": rule.bias_ms,
                         "model": rule.model_source}
                        if lprs_on else None),
            apc_on=rule is not None and rule.apc is not None,
            alpha=(policy.alpha,) if isinstance(policy, AgingPolicy) else None,
            tail_watch=(None if self._tail_watch is None else
                        {"gain": self._tail_watch.gain,
                         "step_backs": self._tail_watch.step_backs,
                         "tail_ratio": self._tail_watch.last_ratio}),
        )
        write_snapshot(self._metrics_path, document)
        self._metrics_written = now
