"""What the scheduler tests share: build an :class:`OfflineEngine` over a scheduler class
with a fairsched config, drive it through a planned workload (add each request at its
step, check every step, abort some requests on a schedule), and check that nothing leaked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import RequestStatus

from fairsched_plugin.sim.fake_engine import OfflineEngine, StepRecord, make_scheduler


def scheduler_engine(model_dir, fairsched: dict | None, cls: type, *, budget: int,
                     **kwargs: Any) -> OfflineEngine:
    """An engine over ``cls`` with ``fairsched`` as its ``additional_config["fairsched"]``
    (None: no additional config) and a token budget of ``budget`` unless
    ``max_num_batched_tokens`` is given. Async scheduling goes with the class, as vLLM
    pairs them: on for an ``AsyncScheduler`` subclass, off otherwise.

    The policy alone: LPRS and APC (on by default) are off unless ``fairsched`` names
    them, so these tests see the order and vLLM's token-budget chunks (LPRS and APC have
    their own tests: ``test_lprs_scheduler``, ``test_lprs_apc``)."""
    kwargs.setdefault("max_num_batched_tokens", budget)
    kwargs.setdefault("async_scheduling", issubclass(cls, AsyncScheduler))
    if fairsched is not None:
        fairsched = {"lprs": {"enabled": False}, "apc": {"enabled": False}, **fairsched}
    additional = None if fairsched is None else {"fairsched": fairsched}
    return OfflineEngine(make_scheduler(cls, model_dir, additional_config=additional, **kwargs))


def assert_nothing_left(engine: OfflineEngine, num_blocks: int) -> None:
    """No request, running entry, queue entry (live or dead heap slot) or KV block is left
    once everything finished or was aborted."""
    scheduler = engine.scheduler
    assert not scheduler.requests
    assert not scheduler.running
    for queue in (scheduler.waiting, scheduler.kv_holding_waiting):
        assert len(queue) == 0
        assert all(entry[-1] is None for entry in getattr(queue, "_heap", ()))
    # Block 0 is vLLM's null block; everything else must be free again.
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == num_blocks - 1


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
