"""Which vLLM scheduler this is, decided once: the hooks the adapter uses on it.

The adapter relies on private scheduler hooks whose names and signatures moved between
vLLM 0.23 and 0.34. Rather than branch on version numbers, :func:`detect_surface` reads
the scheduler classes themselves (method signatures, the attribute names ``__init__``
assigns, the hooks ``schedule()`` calls) and :func:`compat_base` turns what it found into
a small base class that gives the adapter one surface, the 0.32 one, on every supported
release:

==============================  ===========================  ============================
what the adapter uses           0.28+                        0.23 - 0.27
==============================  ===========================  ============================
per-request token cap           ``_reserve_prefill_lookahead``  ``_mamba_block_aligned_split``
                                (called at both sites)       with its flag on during each
                                                             ``schedule()``; the real split
                                                             still runs first when the
                                                             model needs it
==============================  ===========================  ============================

and, independently: ``kv_holding_waiting`` / ``skipped_waiting`` and ``max_num_active_reqs``
/ ``max_num_running_reqs`` (renamed in 0.31), ``schedule(throttle_prefills)``,
``_preempt_request(..., drop_stale_output)``, ``get_kv_cache_usage`` and
``requires_kv_delivery`` (all absent in 0.23). Anything the adapter needs and cannot find
stops start-up with one message that names every missing piece.

One difference is left as vLLM has it: before 0.31, vLLM's waiting loop picks between
``skipped_waiting`` and ``waiting`` with ``_select_waiting_queue_for_scheduling`` (under
``--scheduling-policy priority`` by comparing the two heads with ``Request.__lt__``,
priority then arrival), where 0.31+ drain the held-KV queue first. fairsched's queues
give that method their policy-best heads; which of two blocked-vs-ready heads goes first
under vLLM's priority policy is then vLLM's comparison, not the fairsched key.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from ..config import STRICT_VLLM_ENV

TESTED_VLLM = (Version("0.23"), Version("0.35"))
"""Half-open range [low, high) of vLLM releases whose scheduler source was checked (the
source of 0.23.0, 0.27.1, 0.30.0, 0.32.0, 0.33.0 and 0.34.0 runs the scheduler tests in
CI). A newer release starts when every hook is detected (:func:`check_vllm_version`); an
older one is refused: it predates the hooks."""

RESERVE = "_reserve_prefill_lookahead"
SESSION_UPDATE = "_update_request_as_session"
MAMBA_SPLIT = "_mamba_block_aligned_split"
MAMBA_FLAG = "need_mamba_block_aligned_split"

REQUIRED_HOOKS: dict[str, tuple[str, ...]] = {
    "schedule": (),
    "_update_after_schedule": ("scheduler_output",),
    "update_from_output": ("scheduler_output", "model_runner_output"),
    "shutdown": (),
    "add_request": ("request",),
    "_free_request": ("request",),
    "_preempt_request": ("request", "timestamp"),
}
"""Scheduler methods the adapter overrides or calls on every supported vLLM, with the
parameters it relies on."""

CAP_HOOK_PARAMS: dict[str, tuple[str, ...]] = {
    RESERVE: ("request", "num_computed_tokens", "num_new_tokens"),
    MAMBA_SPLIT: ("request", "num_new_tokens", "num_new_local_computed_tokens",
                  "num_external_computed_tokens"),
}
"""The two per-request hooks that can carry the adapter's token cap, best first."""

RENAMED_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "kv_holding_waiting": ("kv_holding_waiting", "skipped_waiting"),
    "max_num_active_reqs": ("max_num_active_reqs", "max_num_running_reqs"),
}
"""Attributes the adapter reads under their 0.31+ name, with the older name."""

REQUIRED_ATTRIBUTES = ("running", "waiting", "kv_holding_waiting", "kv_cache_manager",
                       "max_num_scheduled_tokens", "max_num_active_reqs", "block_size",
                       "requests", "requires_kv_delivery", "kv_cache_config",
                       "num_spec_tokens")
"""Scheduler state the adapter reads once vLLM's ``__init__`` has run (through the
aliases :func:`compat_base` adds where a name differs)."""

REQUEST_ATTRIBUTES = ("request_id", "arrival_time", "num_prompt_tokens", "num_computed_tokens",
                      "num_output_tokens", "max_tokens", "priority", "num_tokens",
                      "num_tokens_with_spec", "num_output_placeholders", "is_prefill_chunk",
                      "has_encoder_inputs", "status")
"""``Request`` fields the adapter and the policy views read."""


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM lacks something the adapter needs."""


@dataclass(frozen=True)
class SchedulerSurface:
    """What a vLLM scheduler class offers the adapter (see the module docstring)."""

    cap_hook: str
    """RESERVE or MAMBA_SPLIT: the per-request hook that applies the prefill caps."""
    kv_holding_queue: str
    max_active_attribute: str
    schedule_throttles: bool
    preempt_drops_stale_output: bool
    has_kv_cache_usage: bool
    has_kv_delivery: bool
    threshold_spares_lone_request: bool = True
    """Whether ``schedule()`` lifts ``long_prefill_token_threshold`` when only one request
    is eligible (it counts them with ``get_request_counts``; 0.31+), so the plan can
    bound chunks as vLLM will."""
    has_streaming_sessions: bool = False
    """Whether vLLM extends a waiting streaming-input session in place with
    ``_update_request_as_session(session, update)``, which the adapter wraps to queue
    the session again under what it has become."""

    def describe(self) -> str:
        """One log line: the mechanism chosen for each hook."""
        cap = (f"per-request cap through {RESERVE}" if self.cap_hook == RESERVE else
               f"per-request cap through {MAMBA_SPLIT} ({MAMBA_FLAG} on during schedule(), "
               "vLLM's own split first when the model needs it)")
        parts = [
            cap,
            f"held-KV queue {self.kv_holding_queue}",
            f"active-request limit {self.max_active_attribute}",
            "schedule(throttle_prefills)" if self.schedule_throttles
            else "schedule() without throttle_prefills",
            "_preempt_request(drop_stale_output)" if self.preempt_drops_stale_output
            else "_preempt_request without drop_stale_output",
            "get_kv_cache_usage()" if self.has_kv_cache_usage
            else "KV usage from kv_cache_manager.usage",
            "requires_kv_delivery" if self.has_kv_delivery else "no KV delivery (always off)",
            "long-prefill threshold off for a lone request" if self.threshold_spares_lone_request
            else "long-prefill threshold always on",
            "streaming-input sessions re-queued when extended" if self.has_streaming_sessions
            else "no streaming-input sessions",
        ]
        return "; ".join(parts)


def check_vllm_version(version: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``version`` is newer than the tested range (start-up then goes on only if
    every hook is detected). Raises for a release older than the range, which predates
    the hooks, and, with ``FAIRSCHED_STRICT_VLLM=1``, for a newer one: detection cannot
    see a hook whose parameters kept their names but changed their meaning."""
    low, high = TESTED_VLLM
    release = Version(Version(version).base_version)
    if low <= release < high:
        return False
    strict = environ.get(STRICT_VLLM_ENV, "").strip().lower() not in ("", "0", "false", "off")
    if release < low or strict:
        why = (f"; {STRICT_VLLM_ENV} is set, so a newer release is refused"
               if release >= high else "")
        raise UnsupportedVllmError(
            f"fairsched_plugin supports vLLM >={low}; it was tested on >={low},<{high}; "
            f"the installed vLLM is {version}{why}. Install a tested vLLM (e.g. vllm==0.34.0, "
            "or the vLLM your vllm-ascend release pairs with)"
            + (f" or unset {STRICT_VLLM_ENV} to start when every hook is detected."
               if why else ".")
        )
    return True


def untested_release_warning(version: str, surface: SchedulerSurface) -> str:
    """The one start-up warning on a vLLM newer than the tested range: the release, the
    hooks detected on it, and how to report a problem or refuse such releases."""
    low, high = TESTED_VLLM
    return (f"fairsched: vLLM {version} is newer than the releases fairsched_plugin was "
            f"tested on (>={low},<{high}); starting because every scheduler hook it needs "
            f"was found: {surface.describe()}. If scheduling misbehaves, report it to "
            "fairsched_plugin's issue tracker with this line, `pip show vllm "
            "fairsched-plugin` and, if you can, a step trace (the trace_path setting); "
            f"FAIRSCHED_POLICY=fcfs runs vLLM's own order meanwhile. Set "
            f"{STRICT_VLLM_ENV}=1 to refuse untested releases instead.")


def _params(method: Any) -> list[str]:
    return list(inspect.signature(method).parameters)[1:]


def _own_methods(scheduler_cls: type, name: str) -> list[Any]:
    """``name`` as defined by each class of ``scheduler_cls``'s MRO, nearest first: a
    subclass such as vLLM-Ascend's BalanceScheduler may run its own copy of a method."""
    return [klass.__dict__[name] for klass in scheduler_cls.__mro__ if name in klass.__dict__]


def _names_used(functions: Iterable[Any]) -> set[str]:
    """Attribute and global names the functions' bodies use (their code's ``co_names``)."""
    names: set[str] = set()
    for function in functions:
        code = getattr(function, "__code__", None)
        if code is not None:
            names.update(code.co_names)
    return names


def _choose_cap_hook(scheduler_cls: type, problems: list[str]) -> str:
    """The hook every ``schedule()`` in the MRO that does the work calls per request.

    A ``schedule()`` that calls neither hook only delegates (``super().schedule()``); one
    that is a copy of vLLM's loop must call the chosen hook too, or the cap would be
    lost whenever that copy runs."""
    copies = [f for f in _own_methods(scheduler_cls, "schedule")
              if {RESERVE, MAMBA_SPLIT} & _names_used([f])]
    for hook in (RESERVE, MAMBA_SPLIT):
        method = getattr(scheduler_cls, hook, None)
        if not callable(method) or _params(method)[: len(CAP_HOOK_PARAMS[hook])] != list(
                CAP_HOOK_PARAMS[hook]):
            continue
        if hook == MAMBA_SPLIT and MAMBA_FLAG not in _init_names(scheduler_cls):
            continue
        if copies and all(hook in _names_used([f]) for f in copies):
            return hook
    problems.append(
        f"no per-request hook to cap prefill chunks: {scheduler_cls.__name__}.schedule() "
        f"calls neither {RESERVE}{CAP_HOOK_PARAMS[RESERVE]} nor "
        f"{MAMBA_SPLIT}{CAP_HOOK_PARAMS[MAMBA_SPLIT]} (with {MAMBA_FLAG}) in every copy"
    )
    return RESERVE


def _init_names(scheduler_cls: type) -> set[str]:
    return _names_used(_own_methods(scheduler_cls, "__init__"))


def detect_surface(scheduler_cls: type) -> SchedulerSurface:
    """Read ``scheduler_cls`` (vLLM's ``Scheduler`` or a subclass) once; raise
    :class:`UnsupportedVllmError` naming everything the adapter needs and lacks."""
    problems: list[str] = []
    for name, params in REQUIRED_HOOKS.items():
        method = getattr(scheduler_cls, name, None)
        if not callable(method):
            problems.append(f"{scheduler_cls.__name__}.{name} is missing")
        elif _params(method)[: len(params)] != list(params):
            problems.append(f"{scheduler_cls.__name__}.{name} takes {_params(method)}, "
                            f"expected to start with {list(params)}")
    cap_hook = _choose_cap_hook(scheduler_cls, problems)
    assigned = _init_names(scheduler_cls)
    chosen: dict[str, str] = {}
    for name, candidates in RENAMED_ATTRIBUTES.items():
        found = [c for c in candidates if c in assigned]
        if not found:
            problems.append(f"{scheduler_cls.__name__}.__init__ sets none of "
                            + " or ".join(candidates))
        chosen[name] = found[0] if found else name
    if problems:
        raise UnsupportedVllmError(
            "fairsched_plugin cannot hook this vLLM's scheduler: " + "; ".join(problems)
        )
    schedule = getattr(scheduler_cls, "schedule")
    preempt = getattr(scheduler_cls, "_preempt_request")
    session_update = getattr(scheduler_cls, SESSION_UPDATE, None)
    return SchedulerSurface(
        cap_hook=cap_hook,
        kv_holding_queue=chosen["kv_holding_waiting"],
        max_active_attribute=chosen["max_num_active_reqs"],
        schedule_throttles="throttle_prefills" in _params(schedule),
        preempt_drops_stale_output="drop_stale_output" in _params(preempt),
        has_kv_cache_usage=callable(getattr(scheduler_cls, "get_kv_cache_usage", None)),
        has_kv_delivery="requires_kv_delivery" in assigned,
        threshold_spares_lone_request="get_request_counts" in _names_used(
            _own_methods(scheduler_cls, "schedule")),
        has_streaming_sessions=callable(session_update)
        and _params(session_update)[:2] == ["session", "update"],
    )


def check_request_fields(request_cls: type) -> None:
    """The ``Request`` fields the adapter reads are set by ``__init__`` or are properties."""
    available = _init_names(request_cls) | {
        name for klass in request_cls.__mro__ for name in klass.__dict__}
    missing = [name for name in REQUEST_ATTRIBUTES if name not in available]
    if missing:
        raise UnsupportedVllmError(
            "fairsched_plugin cannot read this vLLM's requests: Request has no "
            + ", ".join(missing)
        )


def check_scheduler_state(scheduler: object) -> None:
    """The attributes the adapter reads or replaces exist once vLLM's __init__ has run."""
    missing = [name for name in REQUIRED_ATTRIBUTES if not hasattr(scheduler, name)]
    if missing:
        raise UnsupportedVllmError(
            "fairsched_plugin cannot hook this vLLM's scheduler: it has no "
            + ", ".join(missing)
        )


# The pieces compat_base composes. Each one exists only on the releases that need it, so
# on vLLM 0.32 the base is empty and the adapter calls vLLM directly.


def _alias(real: str) -> property:
    """A read-write property for an attribute vLLM stores under another name."""

    def get(self: Any) -> Any:
        return getattr(self, real)

    def set_(self: Any, value: Any) -> None:
        setattr(self, real, value)

    return property(get, set_, doc=f"This vLLM's {real}, under its 0.31+ name.")


class _CapThroughMambaSplit:
    """Before vLLM 0.28: the cap rides on ``_mamba_block_aligned_split``.

    vLLM calls the split, when its flag is on, at the two places where 0.28+ calls
    ``_reserve_prefill_lookahead`` and with the same meaning of its result (0: skip this
    request). The flag is a plain attribute read only there during ``schedule()``, so it
    is on for exactly the duration of each step; the model's own need (hybrid Mamba
    models) is remembered and vLLM's real split still runs first for it."""

    def schedule(self, throttle_prefills: bool = False) -> Any:
        model_needs_split = getattr(self, MAMBA_FLAG)
        self._fairsched_model_needs_split = model_needs_split
        setattr(self, MAMBA_FLAG, True)
        try:
            return super().schedule(throttle_prefills)  # type: ignore[misc]
        finally:
            setattr(self, MAMBA_FLAG, model_needs_split)

    def _mamba_block_aligned_split(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        if getattr(self, "_fairsched_model_needs_split", False):
            num_new_tokens = super()._mamba_block_aligned_split(  # type: ignore[misc]
                request, num_new_tokens, num_new_local_computed_tokens,
                num_external_computed_tokens)
        computed = (request.num_computed_tokens + num_new_local_computed_tokens
                    + num_external_computed_tokens)
        return self._reserve_prefill_lookahead(request, computed, num_new_tokens)

    def _reserve_prefill_lookahead(
        self, request: Any, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        """The end of the adapter's ``super()`` chain: vLLM's own reservation where this
        vLLM has one (a subclass's ``schedule()`` copy can force this mechanism on 0.28+),
        else none."""
        reserve = getattr(super(), RESERVE, None)
        if reserve is not None:
            return reserve(request, num_computed_tokens, num_new_tokens)
        return max(num_new_tokens, 0)


class _ScheduleWithoutThrottle:
    """vLLM 0.23: ``schedule()`` takes no ``throttle_prefills`` (it never throttles)."""

    def schedule(self, throttle_prefills: bool = False) -> Any:
        return super().schedule()  # type: ignore[misc]


class _PreemptWithoutDropStale:
    """vLLM 0.23: ``_preempt_request(request, timestamp)``; with no KV delivery there is no
    stale output to drop."""

    def _preempt_request(self, request: Any, timestamp: float,
                         drop_stale_output: bool = False) -> Any:
        return super()._preempt_request(request, timestamp)  # type: ignore[misc]


class _KvCacheUsageFromManager:
    """vLLM 0.23: no ``get_kv_cache_usage``; the manager's ``usage`` is the same number."""

    def get_kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage  # type: ignore[attr-defined]


class _NoKvDelivery:
    """vLLM 0.23: no connector can require KV delivery."""

    requires_kv_delivery = False


def compat_base(surface: SchedulerSurface, untested: bool = False) -> type:
    """A base class giving the adapter the 0.32 surface on the scheduler ``surface``
    describes; empty where this vLLM already has it. ``untested``: the release is newer
    than the tested range (:func:`log_surface` warns)."""
    parts: list[type] = []
    if surface.cap_hook == MAMBA_SPLIT:
        parts.append(_CapThroughMambaSplit)
    if not surface.schedule_throttles:
        parts.append(_ScheduleWithoutThrottle)
    if not surface.preempt_drops_stale_output:
        parts.append(_PreemptWithoutDropStale)
    if not surface.has_kv_cache_usage:
        parts.append(_KvCacheUsageFromManager)
    if not surface.has_kv_delivery:
        parts.append(_NoKvDelivery)
    namespace: dict[str, Any] = {"__doc__": surface.describe(), "fairsched_surface": surface,
                                 "fairsched_untested_release": untested}
    for name, real in (("kv_holding_waiting", surface.kv_holding_queue),
                       ("max_num_active_reqs", surface.max_active_attribute)):
        if real != name:
            namespace[name] = _alias(real)
    return type("VllmCompat", tuple(parts) or (object,), namespace)


def wire(scheduler_cls: type, request_cls: type, vllm_version: str) -> type:
    """Start-up, once: check the release and the classes, and return the base class the
    adapter's mixin derives from (see :func:`compat_base`)."""
    untested = check_vllm_version(vllm_version)
    surface = detect_surface(scheduler_cls)
    check_request_fields(request_cls)
    return compat_base(surface, untested)


def log_surface(logger: Any, base: type, vllm_version: str) -> None:
    """Say in the log which mechanism each hook uses on this vLLM; on a release newer than
    the tested range, as one warning that says so."""
    if base.fairsched_untested_release:
        logger.warning(untested_release_warning(vllm_version, base.fairsched_surface))
        return
    logger.info("fairsched: vLLM %s scheduler hooks: %s", vllm_version,
                base.fairsched_surface.describe())
