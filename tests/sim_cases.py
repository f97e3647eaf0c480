"""Simulator cases the tests write by hand: requests given as (arrival s, prompt tokens,
output tokens)."""

from __future__ import annotations

from fairsched_plugin.bench.pairs import request_class
from fairsched_plugin.bench.case_files import WorkloadRequest


def token_case(specs: list[tuple[float, int, int]]) -> list[WorkloadRequest]:
    """One request per spec, named ``r0000``... in order; arrivals must not decrease."""
    return [WorkloadRequest(id=f"r{i:04d}", arrival_s=a, prompt="", prompt_tokens=p,
                            output_tokens=o, tier=0, category="test",
                            request_class=request_class(p))
            for i, (a, p, o) in enumerate(specs)]
