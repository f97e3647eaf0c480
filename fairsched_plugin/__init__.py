"""fairsched_plugin: fairness-aware prefill scheduling for vLLM.

``vllm serve MODEL --scheduler-cls fairsched_plugin.FairScheduler`` selects it. The
scheduler classes are imported lazily so that the policy layer, the config and the tools
work without vLLM installed.
"""

from __future__ import annotations

from typing import Any

# The one place the version is stated: pyproject.toml reads it at build time without
# importing the package, so it stays a plain string literal here.
__version__ = "0.1.0"
__all__ = ["FairScheduler", "FairSyncScheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .adapter import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
