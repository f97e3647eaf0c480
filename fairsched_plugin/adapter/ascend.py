"""vLLM-Ascend: the scheduler settings that would silently replace fairsched's scheduler.

vLLM-Ascend's platform (``NPUPlatform.check_and_update_config``) overwrites
``scheduler_config.scheduler_cls`` with one of its own schedulers, each a whole copy of
vLLM's ``schedule()``, when one of its scheduler features is on. A ``--scheduler-cls
fairsched_plugin.FairScheduler`` (or ``FAIRSCHED_POLICY``) then loses without a word. This
module names those settings, reads them from ``additional_config`` the way vLLM-Ascend
does (0.23.0 at the top level; main under ``additional_config.scheduler_config``, the
top-level key still accepted there), and :func:`guard_platform` wraps the platform's
config check so such a setting stops start-up with a message naming it. vLLM-Ascend is
not imported: it needs CANN and an NPU, and the settings are plain data.

Balance scheduling is not a conflict: it replaces vLLM's ``Scheduler`` class itself with
``BalanceScheduler``, which fairsched's classes then derive from (adapter/compat.py picks
the cap hook its ``schedule()`` copy calls).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError

logger = logging.getLogger("vllm.fairsched")

FAIRSCHED_CLASSES = frozenset({
    "fairsched_plugin.FairScheduler", "fairsched_plugin.FairSyncScheduler",
    "fairsched_plugin.adapter.scheduler.FairScheduler",
    "fairsched_plugin.adapter.scheduler.FairSyncScheduler",
})


@dataclass(frozen=True)
class AscendSchedulerSetting:
    """One vLLM-Ascend setting that swaps in its own scheduler class."""

    key: str
    """Dotted path under ``additional_config`` (or ``additional_config.scheduler_config``)."""
    replaces_with: str
    is_on: Callable[[Any], bool]
    nested: bool
    """Also read under ``additional_config.scheduler_config`` (vLLM-Ascend main)."""


def _truthy(value: Any) -> bool:
    return bool(value) and str(value).lower() not in ("0", "false", "no", "off")


ASCEND_SCHEDULER_SETTINGS = (
    AscendSchedulerSetting("SLO_limits_for_dynamic_batch", "SchedulerDynamicBatch",
                           lambda v: v is not None and v != -1 and str(v) != "-1", False),
    AscendSchedulerSetting("profiling_chunk_config.enabled", "ProfilingChunkScheduler",
                           _truthy, True),
    AscendSchedulerSetting("recompute_scheduler_enable", "RecomputeScheduler", _truthy, True),
    AscendSchedulerSetting("short_request_first_config.enabled",
                           "the short-request-first scheduler", _truthy, True),
    AscendSchedulerSetting("batch_job_sched_config.enabled", "the batch-job-aware scheduler",
                           _truthy, True),
)
"""Checked against vllm-ascend 0.23.0's ``platform.py`` and main's ``ascend_config.py``
(``SchedulerConfig._get_config_value``: nested key first, then the top-level one)."""


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def ascend_scheduler_conflicts(additional_config: Mapping[str, Any] | None) -> list[str]:
    """The vLLM-Ascend scheduler settings on in ``additional_config``, as message parts."""
    config = additional_config or {}
    found = []
    for setting in ASCEND_SCHEDULER_SETTINGS:
        places = [("additional_config." + setting.key, _lookup(config, setting.key))]
        if setting.nested:
            nested = config.get("scheduler_config")
            if isinstance(nested, Mapping):
                places.insert(0, ("additional_config.scheduler_config." + setting.key,
                                  _lookup(nested, setting.key)))
        for where, value in places:
            if value is not None:
                if setting.is_on(value):
                    found.append(f"{where}={value!r} (vLLM-Ascend then runs "
                                 f"{setting.replaces_with} instead)")
                break  # vLLM-Ascend reads the first place that has the key
    return found


def check_ascend_scheduler_settings(additional_config: Mapping[str, Any] | None) -> None:
    """Stop start-up when a vLLM-Ascend setting would replace fairsched's scheduler."""
    conflicts = ascend_scheduler_conflicts(additional_config)
    if conflicts:
        raise ConfigError(
            "fairsched_plugin is selected, but vLLM-Ascend replaces the scheduler class "
            "when " + "; ".join(conflicts) + ". Turn that setting off to use fairsched, "
            "or drop fairsched (--scheduler-cls / FAIRSCHED_POLICY) to use vLLM-Ascend's "
            "scheduler"
        )


def fairsched_selected(scheduler_cls: Any, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this configuration asks for fairsched: by class name, or by
    ``FAIRSCHED_POLICY`` with no class given."""
    if scheduler_cls is None:
        return "FAIRSCHED_POLICY" in environ
    name = scheduler_cls if isinstance(scheduler_cls, str) else (
        f"{scheduler_cls.__module__}.{scheduler_cls.__qualname__}")
    return name in FAIRSCHED_CLASSES


def guard_platform(platform_cls: type) -> None:
    """Wrap ``platform_cls.check_and_update_config`` (once): when fairsched is selected,
    refuse vLLM-Ascend's scheduler settings before the platform applies them, and
    refuse any scheduler class the platform swaps in anyway, naming it."""
    original = platform_cls.__dict__.get("check_and_update_config")
    if original is None:
        original = classmethod(platform_cls.check_and_update_config.__func__)
    if getattr(original.__func__, "_fairsched_guarded", False):
        return

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        before = vllm_config.scheduler_config.scheduler_cls
        selected = fairsched_selected(before)
        if selected:
            check_ascend_scheduler_settings(vllm_config.additional_config)
        original.__func__(cls, vllm_config)
        # Read again: vllm-ascend 0.23.0's recompute scheduling replaces the whole
        # scheduler config object, not only its class.
        after = vllm_config.scheduler_config.scheduler_cls
        if selected and after is not before and not fairsched_selected(after):
            raise ConfigError(
                f"fairsched_plugin is selected, but the platform {cls.__name__} replaced the "
                f"scheduler class with {after!r}; turn off the platform setting that selects "
                "it to use fairsched"
            )

    check_and_update_config._fairsched_guarded = True  # type: ignore[attr-defined]
    platform_cls.check_and_update_config = classmethod(check_and_update_config)
    logger.debug("fairsched: guarding %s.check_and_update_config", platform_cls.__name__)
