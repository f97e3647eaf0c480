"""Benchmark arms: what a policy name on the ``fairsched bench`` command line starts.

``stock`` is vLLM with its own scheduler (no plugin class); every other arm runs
``fairsched_plugin.FairScheduler`` with the named policy, e.g. ``fcfs``, ``aging``,
``aging:alpha=150`` or ``aging:alpha=150:beta=-2``; arms are separated by commas. A
parameter is a key of the policy's config section, or a dotted or top-level config key
(``fcfs:decodes_first=true``, ``guarded-srpf:lprs.target_ms=30``). Parameters go to the plugin through ``FAIRSCHED_*`` environment
variables, which (unlike ``--additional-config``) leave vLLM's compile-cache key alone, so
arms share one compiled model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config import KEYS, ConfigError, load_config
from ..policies.registry import POLICIES

STOCK = "stock"


@dataclass(frozen=True)
class Arm:
    name: str
    engine_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


SWITCHES = ("lprs", "apc")
"""Mechanisms an arm switches on with ``+name`` (e.g. ``aging+lprs+apc``)."""
_CONFIG_PATHS = frozenset(key.path for key in KEYS)
ARMS_HELP = (
    f"comma-separated arms: {STOCK!r} (vLLM's own scheduler) or a policy "
    f"({', '.join(POLICIES)}), optionally with +{'/+'.join(SWITCHES)} and :key=value "
    "parameters, e.g. aging:alpha=150, aging+lprs+apc"
)
"""The ``--arms`` help of ``fairsched bench`` and ``fairsched simulate``."""


def parse_arm(spec: str, settings: Mapping[str, str] | None = None) -> Arm:
    """``policy[+switch...][:key=value...]`` with keys relative to the policy's config
    section; ``settings`` are ``FAIRSCHED_*`` variables shared by every plugin arm."""
    spec = spec.strip()
    if spec == STOCK:
        return Arm(STOCK)
    head, *params = spec.split(":")
    policy, *switches = head.split("+")
    if policy not in POLICIES or any(s not in SWITCHES for s in switches):
        raise ConfigError(
            f"unknown arm {spec!r}: use {STOCK!r} or one of {', '.join(POLICIES)}, "
            f"optionally with +{'/+'.join(SWITCHES)} and :key=value parameters "
            "(e.g. aging:alpha=150, fcfs+lprs+apc)"
        )
    env = {**(settings or {}), "FAIRSCHED_POLICY": policy}
    for switch in switches:
        env[f"FAIRSCHED_{switch.upper()}_ENABLED"] = "true"
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"arm {spec!r}: parameter {item!r} is not key=value")
        section = POLICIES[policy].section
        path = key if key in _CONFIG_PATHS or section is None else f"{section}.{key}"
        env["FAIRSCHED_" + path.replace(".", "_").upper()] = value
    load_config(None, environ=env)  # fail now, not after a server start
    return Arm(spec, ("--scheduler-cls", "fairsched_plugin.FairScheduler"), env)


def parse_arms(text: str, settings: Mapping[str, str] | None = None) -> list[Arm]:
    """Comma-separated arms; ``settings`` (``FAIRSCHED_*`` variables) go to every plugin
    arm and are refused when a ``stock`` arm could not honour them."""
    arms = [parse_arm(spec, settings) for spec in text.split(",") if spec.strip()]
    if settings and any(arm.name == STOCK for arm in arms):
        raise ConfigError(
            f"{', '.join(sorted(settings))} cannot apply to the {STOCK!r} arm (vLLM's own "
            "scheduler); leave it out or drop these settings"
        )
    names = [arm.name for arm in arms]
    if len(set(names)) != len(names):
        raise ConfigError(f"arms must be distinct, got {names}")
    return arms

