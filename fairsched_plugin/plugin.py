"""The ``vllm.general_plugins`` entry point: switch fairsched on from the environment.

vLLM calls :func:`register` in every process it starts. With ``FAIRSCHED_POLICY`` set and no
``--scheduler-cls``, the engine core resolves its scheduler class to fairsched's (async or
sync to match vLLM's mode, as ``FairScheduler`` itself decides): the switch for deployments whose command line is fixed, such
as vLLM-Ascend images. Without ``FAIRSCHED_POLICY`` the scheduler class is left alone.

It also checks the plugin's configuration at launch, in the API server's process, before
any model is loaded: vLLM builds its engine config there (``EngineArgs.create_engine_config``)
after loading general plugins, so a bad key or value stops ``vllm serve`` within seconds,
with the same message the scheduler would give once the engine had started (which it
still does, for engines built without the API server). That process also serves
``/metrics``, so with ``metrics.enabled`` the same hook registers the collector of the
``fairsched:`` series there (``metrics.exporter``), once the launch's instance id is known.
"""

from __future__ import annotations

import logging
import os

from .config import POLICY_ENV, ConfigError, load_config, uses_fairsched

logger = logging.getLogger("vllm.fairsched")

ASYNC_CLASS = "fairsched_plugin.FairScheduler"
SYNC_CLASS = "fairsched_plugin.FairSyncScheduler"
_OWN_CLASSES = (ASYNC_CLASS, SYNC_CLASS, "fairsched_plugin.adapter.scheduler.FairScheduler",
                "fairsched_plugin.adapter.scheduler.FairSyncScheduler")


def register() -> None:
    """Install the launch-time configuration check and, with ``FAIRSCHED_POLICY`` set,
    the environment switch. On an NPU platform (vLLM-Ascend), also guard its config
    check, which would otherwise replace a selected fairsched scheduler silently
    (adapter/ascend.py)."""
    _check_config_at_launch()
    _guard_npu_platform()
    if POLICY_ENV not in os.environ:
        return
    try:
        load_config(None)
    except ConfigError as exc:
        # vLLM only logs a plugin's exceptions; the launch check below raises it again
        # when the engine config is built, which does stop the server.
        logger.error("%s", exc)
    _route_default_scheduler()


def _check_config_at_launch() -> None:
    """Wrap ``EngineArgs.create_engine_config`` so that a launch that uses fairsched
    validates its configuration first (fails with :class:`ConfigError`) and, with
    ``metrics.enabled``, serves its ``fairsched:`` series on ``/metrics``."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, "_fairsched_checked", False):
        return

    def create_engine_config(self: EngineArgs, *args: object, **kwargs: object):
        if not uses_fairsched(self.scheduler_cls):
            return original(self, *args, **kwargs)
        config = load_config(self.additional_config)
        vllm_config = original(self, *args, **kwargs)
        if config.metrics.enabled:
            from .metrics.exporter import register_collector

            register_collector(vllm_config, config.metrics.dir)
        return vllm_config

    create_engine_config._fairsched_checked = True  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config


def _route_default_scheduler() -> None:
    from vllm.config.scheduler import SchedulerConfig

    original = SchedulerConfig.get_scheduler_cls
    if getattr(original, "_fairsched_routed", False):
        return

    def get_scheduler_cls(self: SchedulerConfig) -> type:
        if self.scheduler_cls is None:
            from .adapter.scheduler import FairScheduler

            logger.info(
                "fairsched: %s=%s and no --scheduler-cls: using %s",
                POLICY_ENV, os.environ.get(POLICY_ENV), ASYNC_CLASS,
            )
            return FairScheduler
        name = self.scheduler_cls if isinstance(self.scheduler_cls, str) else (
            f"{self.scheduler_cls.__module__}.{self.scheduler_cls.__qualname__}")
        if name not in _OWN_CLASSES:
            # Nothing falls back silently: another class (given on the command line or
            # swapped in by a platform) would run without the policy asked for.
            raise ConfigError(
                f"fairsched: {POLICY_ENV} is set but the scheduler class is {name}, so "
                "fairsched would not be active; unset that scheduler class (or the platform "
                f"setting that selects it), or unset {POLICY_ENV}"
            )
        return original(self)

    get_scheduler_cls._fairsched_routed = True  # type: ignore[attr-defined]
    SchedulerConfig.get_scheduler_cls = get_scheduler_cls


def _guard_npu_platform() -> None:
    """On vLLM-Ascend's platform (device type ``npu``), refuse its scheduler settings
    while fairsched is selected. Elsewhere nothing is touched; a platform that cannot be
    resolved here is left alone (vLLM reports that itself)."""
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - vLLM's own start-up reports a broken platform
        return
    if getattr(current_platform, "device_type", None) != "npu":
        return
    from .adapter.ascend import guard_platform

    guard_platform(type(current_platform))
