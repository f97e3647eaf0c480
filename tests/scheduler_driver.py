"""Drive an :class:`OfflineEngine` through a planned workload, for scheduler tests: add
each request at its step, check every step, abort some requests on a schedule."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm.v1.request import RequestStatus

from fairsched_plugin.sim.fake_engine import OfflineEngine, StepRecord


def run_workload(
    engine: OfflineEngine,
    workload: Sequence[tuple[int, Any]],
    *,
    budget: int,
    abort_every: int = 0,
    check: Callable[[StepRecord], None] | None = None,
    max_steps: int = 20_000,
) -> set[str]:
    """Step until every request of ``workload`` ((step to add at, request), sorted) has
    finished or been aborted; every step stays within ``budget`` tokens and passes
    ``check``. With ``abort_every`` one running request is aborted every that many steps.
    Returns the aborted ids."""
    scheduler = engine.scheduler
    pending = list(workload)
    aborted: set[str] = set()
    step = 0
    while pending or scheduler.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            engine.add([pending.pop(0)[1]])
        record = engine.step()
        assert record.output.total_num_scheduled_tokens <= budget
        assert sum(record.output.num_scheduled_tokens.values()) <= budget
        if check is not None:
            check(record)
        if abort_every and step % abort_every == abort_every - 1 and scheduler.requests:
            victim = sorted(scheduler.requests)[step % len(scheduler.requests)]
            scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            aborted.add(victim)
        step += 1
        assert step < max_steps, "workload did not finish"
    engine.drain()
    return aborted
