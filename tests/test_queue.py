"""``PolicyRequestQueue`` with real vLLM ``Request`` objects."""

from __future__ import annotations

import math
import random
from contextlib import closing

import pytest

pytest.importorskip("vllm")

from fairsched_plugin.settings import GuardedAgingConfig  # noqa: E402
from fairsched_plugin.sim.fake_engine import make_request  # noqa: E402
from fairsched_plugin.adapter.queue import PolicyRequestQueue  # noqa: E402
from fairsched_plugin.adapter.request_views import request_view  # noqa: E402
from fairsched_plugin.policies import AgingPolicy, FCFSPolicy  # noqa: E402

AGING = AgingPolicy(alpha=1.0, beta=-1.0)  # value = arrival + remaining prompt


def aging_key(request):
    return AGING.key(request_view(request))


def fcfs_key(request):
    return FCFSPolicy().key(request_view(request))


def req(rid: str, prompt: int, arrival: float):
    return make_request(rid, prompt_tokens=prompt, max_tokens=4, arrival_time=arrival)


@pytest.fixture
def five():
    """Aging values (arrival + prompt): d 3, b 12, e 25, a 40, c 110."""
    return {
        "a": req("a", 40, 0.0),
        "b": req("b", 10, 2.0),
        "c": req("c", 100, 10.0),
        "d": req("d", 2, 1.0),
        "e": req("e", 20, 5.0),
    }


EXPECTED = ["d", "b", "e", "a", "c"]


def filled(requests) -> PolicyRequestQueue:
    queue = PolicyRequestQueue(aging_key)
    for request in requests:
        queue.add_request(request)
    return queue


def drain(queue: PolicyRequestQueue) -> list[str]:
    out = []
    while queue:
        out.append(queue.pop_request().request_id)
    return out


def test_hand_computed_keys(five):
    assert [aging_key(five[r])[0] for r in EXPECTED] == [3.0, 12.0, 25.0, 40.0, 110.0]


def test_pop_and_peek_return_smallest_key(five):
    queue = filled(five.values())
    assert len(queue) == 5 and bool(queue)
    seen = []
    while queue:
        peeked = queue.peek_request()
        popped = queue.pop_request()
        assert peeked is popped
        seen.append(popped.request_id)
    assert seen == EXPECTED
    assert len(queue) == 0 and not queue


def test_empty_queue_raises_index_error():
    queue = PolicyRequestQueue(aging_key)
    with pytest.raises(IndexError):
        queue.pop_request()
    with pytest.raises(IndexError):
        queue.peek_request()


def test_key_is_the_policy_order_not_insertion_order():
    queue = PolicyRequestQueue(fcfs_key)
    for rid, arrival in [("x", 3.0), ("y", 1.0), ("z", 2.0), ("w", 1.0)]:
        queue.add_request(req(rid, 10, arrival))
    assert drain(queue) == ["w", "y", "z", "x"]  # arrival, then id


def test_remove_request(five):
    queue = filled(five.values())
    queue.remove_request(five["d"])  # the head
    queue.remove_request(five["a"])
    assert len(queue) == 3
    assert five["d"] not in list(queue)
    assert queue.peek_request() is five["b"]
    assert drain(queue) == ["b", "e", "c"]


def test_remove_missing_request_raises(five):
    queue = filled([five["a"], five["b"]])
    with pytest.raises(ValueError, match="c"):
        queue.remove_request(five["c"])
    queue.remove_request(five["a"])
    with pytest.raises(ValueError):
        queue.remove_request(five["a"])  # already removed
    assert len(queue) == 1
    assert drain(queue) == ["b"]


def test_remove_requests_tolerates_missing(five):
    queue = filled([five[r] for r in "abcd"])
    outsider = five["e"]
    queue.remove_requests([five["b"], outsider, five["d"], five["b"]])
    assert len(queue) == 2
    assert [r.request_id for r in queue] == ["a", "c"]
    assert drain(queue) == ["a", "c"]


def test_remove_everything_leaves_no_live_entries(five):
    queue = filled(five.values())
    queue.remove_requests(list(five.values()))
    assert len(queue) == 0 and not queue
    assert list(queue) == []
    assert list(queue.iter_in_order()) == []
    with pytest.raises(IndexError):
        queue.pop_request()


def test_duplicate_add_raises(five):
    queue = filled([five["a"]])
    with pytest.raises(ValueError, match="already waiting"):
        queue.add_request(five["a"])
    with pytest.raises(ValueError):
        queue.prepend_request(five["a"])
    assert len(queue) == 1


def test_readd_after_remove(five):
    queue = filled(five.values())
    queue.remove_request(five["d"])
    queue.add_request(five["d"])
    assert len(queue) == 5
    assert drain(queue) == EXPECTED


def test_iter_in_order_yields_in_key_order(five):
    queue = filled(five.values())
    queue.remove_request(five["e"])  # a dead entry in the heap is skipped
    assert [r.request_id for r in queue.iter_in_order()] == ["d", "b", "a", "c"]
    assert len(queue) == 4
    assert drain(queue) == ["d", "b", "a", "c"]


def test_iter_in_order_stopped_early_leaves_queue_intact():
    rng = random.Random(5)
    requests = [req(f"r{i:02d}", rng.randint(1, 500), rng.randint(0, 100) / 4) for i in range(40)]
    expected = [r.request_id for r in sorted(requests, key=aging_key)]
    queue = filled(requests)

    it = queue.iter_in_order()
    first_three = [next(it).request_id for _ in range(3)]
    assert first_three == expected[:3]
    it.close()
    assert len(queue) == 40

    # An iteration abandoned in a for loop (break) is closed too once dropped.
    for n, request in enumerate(queue.iter_in_order()):
        if n == 10:
            break
    del request
    assert [r.request_id for r in queue.iter_in_order()] == expected  # exhausted: restored
    assert [r.request_id for r in queue] == expected
    assert drain(queue) == expected


def test_dead_entries_are_compacted():
    requests = [req(f"r{i:04d}", 1 + i % 97, i / 8) for i in range(1000)]
    queue = filled(requests)
    keep = requests[::100]  # 10 survivors
    for request in requests:
        if request not in keep:
            queue.remove_request(request)
    assert len(queue) == 10
    # Compaction runs whenever the heap exceeds 2 * live + 64 entries.
    assert len(queue._heap) <= 2 * 10 + 64
    assert drain(queue) == [r.request_id for r in sorted(keep, key=aging_key)]


def test_dead_entries_are_compacted_in_bulk():
    requests = [req(f"r{i:04d}", 10, i / 8) for i in range(1000)]
    queue = filled(requests)
    queue.remove_requests(requests[10:])
    assert len(queue) == 10
    assert len(queue._heap) <= 2 * 10 + 64
    assert [r.request_id for r in queue] == [f"r{i:04d}" for i in range(10)]


def test_iter_is_a_sorted_snapshot(five):
    queue = filled(five.values())
    snapshot = iter(queue)
    assert len(queue._heap) == 5  # taking the snapshot pops nothing
    queue.remove_request(five["d"])
    queue.pop_request()
    assert [r.request_id for r in snapshot] == EXPECTED
    assert [r.request_id for r in queue] == ["e", "a", "c"]


def test_prepend_popped_request_restores_it(five):
    queue = filled(five.values())
    head = queue.pop_request()
    assert head is five["d"] and len(queue) == 4
    queue.prepend_request(head)
    assert len(queue) == 5
    assert queue.peek_request() is head
    assert drain(queue) == EXPECTED


def test_prepend_requests_restores_order(five):
    queue = filled(five.values())
    popped = [queue.pop_request() for _ in range(3)]
    queue.prepend_requests(reversed(popped))
    assert drain(queue) == EXPECTED


def test_random_operations_match_a_sorted_list():
    rng = random.Random(11)
    queue = PolicyRequestQueue(aging_key)
    model: list = []
    pool = [req(f"q{i:03d}", rng.randint(1, 300), rng.randint(0, 400) / 8) for i in range(300)]
    outside = list(pool)
    for _ in range(3000):
        op = rng.random()
        if op < 0.45 and outside:
            r = outside.pop(rng.randrange(len(outside)))
            queue.add_request(r)
            model.append(r)
        elif op < 0.7 and model:
            r = model.pop(rng.randrange(len(model)))
            queue.remove_request(r)
            outside.append(r)
        elif model:
            model.sort(key=aging_key)
            assert queue.peek_request() is model[0]
            r = queue.pop_request()
            assert r is model.pop(0)
            outside.append(r)
        assert len(queue) == len(model)
    model.sort(key=aging_key)
    assert list(queue) == model
    assert len(queue._heap) <= 2 * len(model) + 64 + 1


def test_the_snapshot_is_taken_once_and_a_rekey_reads_it_not_the_request(five):
    """Key, deadline and work read one snapshot per entry; a re-key takes the keys again
    from the stored snapshots, under the policy's new parameters."""
    taken = []

    def snapshot(request):
        taken.append(request.request_id)
        return request_view(request)

    policy = AgingPolicy(alpha=1.0, beta=-1.0)
    queue = PolicyRequestQueue(policy.key, deadline=lambda view: math.inf,
                               clock=lambda: 0.0, work=lambda view: view.remaining_prefill,
                               snapshot=snapshot)
    for request in five.values():
        queue.add_request(request)
    assert sorted(taken) == sorted(five) and queue.work == 172
    assert [request.request_id for request in queue] == EXPECTED
    policy.set_alpha(1000.0)  # now arrival order: a 0, d 1, b 2, e 5, c 10
    queue.rekey()
    assert sorted(taken) == sorted(five)  # no snapshot taken again
    assert drain(queue) == ["a", "d", "b", "e", "c"]


# --------------------------------------------------------------------------- deadline lane


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def deadline_queue(deadlines: dict[str, float], clock: _Clock) -> PolicyRequestQueue:
    """Keys by prompt length (shortest first), deadlines from ``deadlines``."""
    return PolicyRequestQueue(
        lambda r: (r.num_prompt_tokens, r.arrival_time, r.request_id),
        deadline=lambda r: deadlines[r.request_id],
        clock=clock,
        work=lambda r: r.num_tokens - r.num_computed_tokens,
    )


FIVE_DEADLINES = {"a": 4.0, "b": 50.0, "c": 3.0, "d": 60.0, "e": 70.0}
"""For ``five`` (a 40 tokens, b 10, c 100, d 2, e 20): c and a are overdue from t=4."""


def five_by_deadline(five, now: float) -> tuple[PolicyRequestQueue, _Clock]:
    clock = _Clock(now)
    queue = deadline_queue(FIVE_DEADLINES, clock)
    for request in five.values():
        queue.add_request(request)
    return queue, clock


def test_deadline_lane_serves_overdue_requests_first_in_deadline_order(five):
    queue, clock = five_by_deadline(five, now=5.0)
    assert queue.work == 40 + 10 + 100 + 2 + 20
    assert [r.request_id for r in queue.iter_in_order()] == ["c", "a", "d", "b", "e"]
    assert [r.request_id for r in queue] == ["c", "a", "d", "b", "e"]
    assert queue.peek_request().request_id == "c"
    assert queue.pop_request().request_id == "c"
    assert queue.work == 72
    clock.now = 55.0  # b is overdue now too
    assert drain(queue) == ["a", "b", "d", "e"]
    assert queue.work == 0 and not queue


def test_peek_keyed_gives_the_queued_key_or_none_from_the_overdue_lane(five):
    queue, clock = five_by_deadline(five, now=2.0)
    head, key = queue.peek_keyed()
    assert head.request_id == "d" and key == (2, 1.0, "d")
    clock.now = 5.0  # c and a are overdue: the lane's head has no key that decides
    head, key = queue.peek_keyed()
    assert head.request_id == "c" and key is None
    queue.remove_requests([five["c"], five["a"]])
    assert queue.peek_keyed() == (five["d"], (2, 1.0, "d"))


def test_rank_of_key_is_the_rank_of_a_request_that_is_not_overdue():
    from fairsched_plugin.policies import GuardedAging

    for policy in (AGING, GuardedAging(GuardedAgingConfig(slack=1.25, window_s=0.0, auto_factor=0.25))):
        view = request_view(req("x", 30, 2.0))
        view.deadline = 1e9
        assert policy.rank_of_key(policy.key(view)) == policy.ranker(0.0)(view)


def test_iter_in_order_puts_everything_back_and_yields_each_request_once(five):
    deadlines = {"a": 4.0, "b": 1.0, "c": 3.0, "d": 60.0, "e": 70.0}
    queue = deadline_queue(deadlines, _Clock(10.0))
    for request in five.values():
        queue.add_request(request)
    first = [r.request_id for r in queue.iter_in_order()]
    assert first == ["b", "c", "a", "d", "e"]
    assert [r.request_id for r in queue.iter_in_order()] == first
    assert drain(queue) == first


def test_deadline_queue_removal_and_compaction_keep_both_lanes_consistent():
    clock = _Clock(0.0)
    deadlines = {f"r{i}": float(i) for i in range(400)}
    queue = deadline_queue(deadlines, clock)
    requests = [req(f"r{i}", 1 + (i * 37) % 500, float(i)) for i in range(400)]
    for request in requests:
        queue.add_request(request)
    queue.remove_requests(requests[::2])
    assert len(queue) == 200
    assert len(queue._heap) <= 2 * 200 + 64 and len(queue._overdue_heap) <= 2 * 200 + 64
    clock.now = 100.5  # r1, r3, ..., r99 are overdue
    order = drain(queue)
    assert order[:50] == [f"r{i}" for i in range(1, 101, 2)]
    rest = [int(rid[1:]) for rid in order[50:]]
    assert [1 + (i * 37) % 500 for i in rest] == sorted(1 + (i * 37) % 500 for i in rest)
    assert queue.work == 0


def test_a_deadline_queue_needs_a_clock():
    with pytest.raises(ValueError, match="clock"):
        PolicyRequestQueue(aging_key, deadline=lambda r: 0.0)


def test_priority_levels_order_by_priority_then_key():
    """vLLM's priority first (smaller first), the policy's key within a level."""
    from fairsched_plugin.adapter.queue import PriorityLevelQueue

    queue = PriorityLevelQueue(lambda: PolicyRequestQueue(aging_key))
    requests = {
        "low-short": make_request("low-short", 5, 4, 0.0, priority=1),
        "high-long": make_request("high-long", 90, 4, 1.0, priority=0),
        "high-short": make_request("high-short", 10, 4, 2.0, priority=0),
        "urgent": make_request("urgent", 500, 4, 3.0, priority=-1),
    }
    for request in requests.values():
        queue.add_request(request)
    expected = ["urgent", "high-short", "high-long", "low-short"]
    assert len(queue) == 4 and queue
    with closing(queue.iter_in_order()) as it:
        assert next(it).request_id == "urgent"
        assert next(it).request_id == "high-short"
    assert [r.request_id for r in queue] == expected  # the partial look put everything back
    queue.remove_request(requests["high-short"])
    queue.remove_requests([requests["urgent"]])
    assert queue.peek_request().request_id == "high-long"
    assert [queue.pop_request().request_id for _ in range(2)] == ["high-long", "low-short"]
    assert not queue and len(queue) == 0
    with pytest.raises(IndexError):
        queue.pop_request()


def test_changes_count_insertions_and_rekeys_not_departures(five):
    """The adapter's order check trusts its last answer while nothing entered the queue
    and no key was taken again: pops and removals must leave the count alone."""
    queue = filled(five.values())
    assert queue.changes == 5
    queue.pop_request()
    queue.remove_request(five["c"])
    queue.remove_requests([five["a"]])
    assert queue.changes == 5
    queue.rekey()
    assert queue.changes == 6
    queue.prepend_request(five["a"])
    assert queue.changes == 7


def test_last_popped_is_the_head_with_the_snapshot_it_was_queued_under(five):
    queue = PolicyRequestQueue(AGING.key, snapshot=request_view)
    for request in five.values():
        queue.add_request(request)
    assert queue.last_popped is None
    head = queue.pop_request()
    popped, snapshot = queue.last_popped
    assert popped is head and head.request_id == "d"
    assert snapshot.request_id == "d" and snapshot.remaining_prefill == 2
    queue.remove_request(five["b"])
    assert queue.last_popped[0] is head


def test_earliest_deadline_skips_departed_requests(five):
    queue, _clock = five_by_deadline(five, now=0.0)
    assert queue.earliest_deadline() == 3.0
    queue.remove_request(five["c"])
    assert queue.earliest_deadline() == 4.0
    assert PolicyRequestQueue(aging_key).earliest_deadline() == math.inf
    queue.remove_requests(list(five.values()))
    assert queue.earliest_deadline() == math.inf
