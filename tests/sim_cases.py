"""Simulator cases the tests write by hand: requests given as (arrival s, prompt tokens,
output tokens)."""

from __future__ import annotations

from typing import Any

from fairsched_plugin.experiment.pairs import request_class
from fairsched_plugin.experiment.case_files import WorkloadRequest

REVISION_1_DEFAULT = ("guarded-srpf:lprs.enabled=true:apc.enabled=true:tail_window=0"
                      ":overtake_running=true")
"""The default as results files without a ``default_revision`` ran it."""


def as_committed(results: dict[str, Any], arm: str) -> str:
    """``arm`` spelled as it ran when ``results`` were written (``suite.DEFAULT_REVISION``)."""
    if arm == results["meta"]["default_policy"] and "default_revision" not in results["meta"]:
        return REVISION_1_DEFAULT
    return arm


def committed_metrics(metrics: dict[str, Any], committed: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` limited to the figures a committed cell recorded (later figures, such as
    the prefill tokens computed, are not in older files)."""
    return {key: value for key, value in metrics.items() if key in committed}


def token_case(specs: list[tuple[float, int, int]]) -> list[WorkloadRequest]:
    """One request per spec, named ``r0000``... in order; arrivals must not decrease."""
    return [WorkloadRequest(id=f"r{i:04d}", arrival_s=a, prompt="", prompt_tokens=p,
                            output_tokens=o, tier=0, category="test",
                            request_class=request_class(p))
            for i, (a, p, o) in enumerate(specs)]
