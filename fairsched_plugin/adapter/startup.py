"""Start-up: the plugin's state on top of a vLLM scheduler, decided once.

At import, which vLLM scheduler this is (``adapter.compat``: the release and the hooks it
offers). When the scheduler is built: the validated config, the policy and its queues,
the chunk rule (the latency model loaded and checked, alignment from the platform), the
step monitor and its listeners, and the log lines that say what runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from ..config import FairschedConfig, load_config
from ..policies import AgingPolicy, AutoAlpha, PrefillRateEstimator, RequestView, make_policy
from ..policies.chunk_rule import LatencyChunkRule
from ..policies.lprs import auto_target_tokens
from ..policies.decode_hold import decode_cap
from ..predictor.memory import make_memory_provider
from ..predictor.roofline import built_in_model
from ..predictor.runtime import LatencyPredictor
from .compat import check_scheduler_state, log_surface, wire
from .profiling import StepProfiler, kv_state_reader
from .queue import PolicyRequestQueue, PriorityLevelQueue
from .steps import StepMonitor

# A child of "vllm": start-up lines appear in vLLM's own log stream and format.
logger = logging.getLogger("vllm.fairsched")

VllmCompat = wire(Scheduler, Request, vllm.__version__)
"""This vLLM's scheduler surface, decided once at import (adapter/compat.py)."""


def _view_deadline(view: RequestView) -> float:
    return view.deadline


def _view_work(view: RequestView) -> int:
    return view.remaining_prefill


def _device_name(platform: Any) -> str:
    """The accelerator's name as its runtime reports it ("" where there is none)."""
    if platform.device_type == "cpu":
        return ""
    try:
        return str(platform.get_device_name(0))
    except Exception:  # a platform without the query: the device type alone decides
        return ""


def engine_index(parallel_config: Any) -> int:
    """This engine core's data-parallel rank. vLLM runs the ranks of a model without
    experts as independent engines (``reconfigure_for_independent_dp_rank``: rank 0 of a
    size-1 group each) and keeps the original rank in ``data_parallel_index``."""
    index = getattr(parallel_config, "data_parallel_index", None)
    if index is None:
        index = getattr(parallel_config, "data_parallel_rank", 0)
    return int(index or 0)


def per_engine_path(path: str, parallel_config: Any) -> str:
    """``path`` with the data-parallel rank before its suffix when several engine cores
    run (``trace.jsonl`` -> ``trace.dp1.jsonl``), so their files do not collide. Rank 0
    of independent ranks keeps the plain name (it cannot tell it has peers)."""
    rank = engine_index(parallel_config)
    if getattr(parallel_config, "data_parallel_size", 1) <= 1 and rank == 0:
        return path
    stem, dot, suffix = path.rpartition(".")
    if not dot or "/" in suffix:
        return f"{path}.dp{rank}"
    return f"{stem}.dp{rank}.{suffix}"


def vllm_config_of(args: tuple, kwargs: dict) -> Any:
    """vLLM passes constructor arguments by keyword; accept the first positional too."""
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


class SchedulerStartUp(VllmCompat):  # type: ignore[misc,valid-type]
    """Builds the plugin's state in ``__init__`` (part of
    ``scheduler.FairSchedulingMixin``, which derives from it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ``clock``: what "now" is for the policy (ages, deadlines) and the step monitor;
        # the simulator passes its virtual clock, a server the wall clock.
        self._clock: Callable[[], float] = kwargs.pop("clock", None) or time.time
        vllm_config = vllm_config_of(args, kwargs)
        config = self.fairsched_config = load_config(vllm_config.additional_config)
        self.fairsched_policy = make_policy(config, epoch=self._clock())
        super().__init__(*args, **kwargs)
        check_scheduler_state(self)
        log_surface(logger, VllmCompat, vllm.__version__)
        policy = self.fairsched_policy
        self._now = self._clock()
        self._deadlines: dict[str, float] = {}
        guard = policy.admission_guard
        self._tail_watch = guard.watch if guard is not None else None
        self._step_backs_logged = 0
        self._preemptions = 0
        self._cached_prefix: dict[str, int] = {}
        self._failures: dict[str, int] = {}
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
        # The plugin's override (``scheduler``) comes before this class in the MRO.
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
        self._auto_alpha: AutoAlpha | None = None
        if isinstance(policy, AgingPolicy) and policy.auto_factor is not None:
            self._auto_alpha = AutoAlpha(policy.auto_factor, PrefillRateEstimator())
            listeners.append(self._calibrate_alpha)
        self._chunk_rule = self._make_chunk_rule(config)
        self._aligned_block = (self.block_size if self._chunk_rule is not None
                               and self._chunk_rule.align else 0)
        """The KV block size every prefill chunk's end aligns to (0: no alignment)."""
        if self._chunk_rule is not None and self._chunk_rule.observes_steps:
            listeners.append(self._chunk_rule.observe_step)
        self._profiler: StepProfiler | None = None
        parallel = vllm_config.parallel_config
        if config.profile.path:
            self._profiler = StepProfiler.for_scheduler(
                self, config.profile, vllm_config, per_engine_path(config.profile.path, parallel))
            listeners.append(self._profiler.on_step)
        trace_path = per_engine_path(config.trace_path, parallel) if config.trace_path else None
        description = self._policy_description()
        # A deadline policy counts each step's prefill work as it is scheduled, from the
        # monitor's record of the step (``StepTrace``).
        monitored = bool(trace_path or listeners or policy.uses_deadlines)
        self._start_metrics(vllm_config, description, listeners if monitored else None)
        self._steps = (
            StepMonitor(trace_path, listeners,
                        clock=None if self._clock is time.time else self._clock)
            if monitored
            else None
        )
        self._log_active(vllm_config, description)

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
            guard=policy.admission_guard,
        )

    def _make_chunk_rule(self, config: FairschedConfig) -> LatencyChunkRule | None:
        """LPRS, APC and alignment, when any is on; the latency model is loaded and
        checked now, so a missing or mismatched model stops start-up."""
        from vllm.platforms import current_platform

        align = config.lprs.align == "on" or (
            config.lprs.align == "auto" and current_platform.device_type == "npu"
        )
        if not (config.lprs.enabled or config.apc.enabled or align):
            return None
        if not getattr(self.scheduler_config, "enable_chunked_prefill", True):
            # LPRS, APC and alignment size prefill chunks; with chunked prefill off vLLM
            # runs each prompt whole (a KV connector such as vLLM's ExampleConnector saves
            # a prompt's KV once, from its first step, and relies on that).
            logger.info("fairsched: chunked prefill is off, so LPRS, APC and chunk "
                        "alignment are off: every prompt is prefilled whole, as vLLM does")
            return None
        predictor = memory = None
        if config.lprs.enabled and config.predictor.path:
            memory = make_memory_provider(config.profile.memory, kv_state_reader(self))
            predictor = LatencyPredictor.from_config(config.predictor, memory.name)
        elif config.lprs.enabled:
            # The built-in model reads no memory feature: the cheapest provider.
            memory = make_memory_provider("kv_cache", kv_state_reader(self))
            predictor = built_in_model(
                config.predictor.model, config.predictor.device,
                vllm_model_config=self.vllm_config.model_config,
                device_type=current_platform.device_type,
                device_name=_device_name(current_platform))
            logger.info("fairsched: LPRS latency model: %s%s", predictor.describe(),
                        "" if predictor.ready else
                        "; LPRS plans as the token budget does until its predictions agree "
                        "with the measured step times")
        return LatencyChunkRule(config.lprs, config.apc, predictor, memory, self.block_size,
                                align, self.max_num_scheduled_tokens)

    def _policy_description(self) -> str:
        """The policy and the service settings around it, as the start-up line and the
        metrics' policy info give them."""
        policy = self.fairsched_policy.describe()
        rule = self._chunk_rule
        if rule is not None and rule.params is not None:
            target = rule.params.target_ms
            if rule.auto_target:
                now = f"{target:.0f} ms now" if target > 0 else "not predicted yet"
                policy += (", LPRS (target: the predicted time of a "
                           f"{auto_target_tokens(self.max_num_scheduled_tokens)}-token prefill "
                           f"step, {now})")
            else:
                policy += f", LPRS (target {target:g} ms)"
        if rule is not None and rule.apc is not None:
            policy += f", APC (at most {rule.apc.max_active} prefills)"
        if self._ranked:
            policy += f", ranked service (max_batch_size={self.fairsched_config.max_batch_size})"
        if self._decode_cap:
            policy += (f", decodes held to {self._decode_cap} per step while prefill work "
                       f"waits (decode_share={self.fairsched_config.decode_share:g})")
            if self._max_tpot_s:
                policy += (", none held beyond "
                           f"{self.fairsched_config.decode_share_max_tpot_ms:g} ms per output "
                           "token")
        return policy

    def _log_active(self, vllm_config: Any, policy: str) -> None:
        from vllm.platforms import current_platform

        mode_is_async = isinstance(self, AsyncScheduler)
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
