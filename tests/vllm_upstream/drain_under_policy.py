"""fairsched's check of vLLM's newer scheduler paths, written in vLLM's own test idiom and
run inside the extracted ``tests/v1/core`` of a release (the harness copies it there as
``tests/v1/core/test_fairsched_drain.py``), so vLLM's mock KV connector and helpers drive
the plugin's scheduler under whatever ``FAIRSCHED_POLICY`` the harness sets.

The paths: asynchronous KV loads (``async_kv_waiting``, ``_next_waiting_queue``, the
in-flight load limit, ``_drain_deferred_loads``), the reservations parked for them
(``_reserve_parked``/``_unreserve_parked``), failed and invalid loads that recompute, and
draft tokens (``_drafts_unused``). Each touches the waiting queues or prefills, which the
policy reorders. The check: with loads finishing, failing and being aborted at random on a
tight KV pool, every request ends (finished or aborted), every queue empties, no
reservation is left and every KV block is free again. Encoder inputs are not driven here:
vLLM's own encoder tests need a multimodal model from the hub (no network here).
"""

import random

import pytest

from tests.v1.core.utils import create_requests, create_scheduler, mock_kv
from tests.v1.kv_connector.unit.utils import create_model_runner_output
from vllm.v1.request import RequestStatus

NUM_BLOCKS = 64
ARRIVAL_STEPS = 60
DRAIN_STEPS = 3000


def _step(scheduler, rng, events, fail_loads: bool) -> None:
    """One engine step: schedule, then receive (or fail) some in-flight KV loads."""
    output = scheduler.schedule()
    finished, failed = set(), set()
    # An aborted request whose load is in flight stays until the load reports back.
    aborted_loads = getattr(scheduler, "_aborted_kv_loads", set())
    for req_id, request in sorted(scheduler.requests.items()):
        if ((request.status == RequestStatus.WAITING_FOR_REMOTE_KVS or req_id in aborted_loads)
                and req_id not in scheduler.finished_recving_kv_req_ids):
            x = rng.random()
            if x < 0.5:
                (failed if fail_loads and x < 0.1 else finished).add(req_id)
    events |= {"received"} if finished else set()
    events |= {"failed"} if failed else set()
    if output.total_num_scheduled_tokens:
        events.add("scheduled")
    scheduler.update_from_output(
        output,
        create_model_runner_output(
            [scheduler.requests[i] for i in sorted(output.num_scheduled_tokens)],
            finished_recving=finished | failed,
            failed_recving=failed,
        ),
    )


@pytest.mark.parametrize("num_spec_tokens", [None, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_async_kv_loads_drain_under_the_policy(seed, num_spec_tokens):
    rng = random.Random(seed)
    scheduler = create_scheduler(
        num_blocks=NUM_BLOCKS,
        max_num_seqs=8,
        use_kv_connector=mock_kv(matched_tokens=0, is_async=True),
        num_speculative_tokens=num_spec_tokens,
    )
    scheduler.recompute_kv_load_failures = True

    def match(request, computed):
        tokens = min(rng.randrange(12), (request.num_tokens - computed) // 16) * 16
        return (tokens, True) if tokens else (0, False)

    scheduler.connector.get_num_new_matched_tokens = match
    events: set[str] = set()
    added = aborted = 0
    for step in range(ARRIVAL_STEPS):
        for i in range(rng.choice((0, 1, 2, 5))):
            scheduler.add_request(create_requests(
                1, rng.randrange(16, 400), max_tokens=rng.randrange(1, 8),
                req_ids=[f"{step}.{i}"], ignore_eos=True)[0])
            added += 1
        _step(scheduler, rng, events, fail_loads=True)
        for req_id in sorted(scheduler.requests):
            if rng.random() < 0.01:
                scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
                aborted += 1
    for _ in range(DRAIN_STEPS):
        if not scheduler.requests:
            break
        _step(scheduler, rng, events, fail_loads=False)
    assert not scheduler.requests, (
        f"{len(scheduler.requests)} of {added} requests never ended: "
        + str(sorted((r.request_id, str(r.status), r.num_computed_tokens)
                     for r in scheduler.requests.values())[:5]))
    assert {"received", "failed", "scheduled"} <= events, events
    assert added > 50 and aborted > 0
    assert not scheduler.running
    for name in ("waiting", "skipped_waiting", "kv_holding_waiting", "async_kv_waiting"):
        queue = getattr(scheduler, name, None)
        assert queue is None or len(queue) == 0, name
    assert not getattr(scheduler, "_parked_reservations", {})
    assert getattr(scheduler, "_parked_reserved_blocks", 0) == 0
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1  # block 0 is the null block
