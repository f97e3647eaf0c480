"""``plan_prefill_caps``: hand-worked cases, laziness, and a seeded property check."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest

from fairsched_plugin.policies import AgingPolicy, FCFSPolicy, RequestView, plan_prefill_caps

FCFS = FCFSPolicy()
AGING = AgingPolicy(alpha=1.0, beta=-1.0)  # value = arrival + remaining, easy to read


def view(rid: str, arrival: float, prompt: int, computed: int = 0) -> RequestView:
    return RequestView(rid, arrival, prompt, computed_tokens=computed)


class Counting:
    """An iterator over views that records how many were pulled."""

    def __init__(self, views: Iterable[RequestView]) -> None:
        self._it = iter(list(views))
        self.pulled = 0

    def __iter__(self) -> Iterator[RequestView]:
        return self

    def __next__(self) -> RequestView:
        item = next(self._it)
        self.pulled += 1
        return item


def plan(policy, running, waiting, *, decode=0, budget=256, slots=100, kv=10**9, full=True):
    return plan_prefill_caps(
        policy,
        running,
        waiting,
        decode_tokens=decode,
        token_budget=budget,
        free_slots=slots,
        free_kv_tokens=kv,
        full_sequence_must_fit=full,
    )


# --------------------------------------------------------------------------- budget flow


def test_no_running_prefills_no_caps():
    assert plan(FCFS, [], [view("w", 0.0, 10)]) == {}


def test_decodes_take_the_budget_first():
    running = [view("r", 0.0, 500, computed=200)]  # 300 left
    # 256 - 200 decode tokens = 56 left for prefill.
    assert plan(FCFS, running, [], decode=200) == {"r": 56}
    assert plan(FCFS, running, [], decode=0) == {"r": 256}


@pytest.mark.parametrize("decode", [256, 300])
def test_zero_caps_when_decodes_exhaust_the_budget(decode):
    running = [view("r1", 0.0, 500, computed=200), view("r2", 1.0, 50)]
    waiting = Counting([view("w", 2.0, 10)])
    assert plan(FCFS, running, waiting, decode=decode) == {"r1": 0, "r2": 0}
    assert waiting.pulled == 0


def test_running_prefill_ranked_first_gets_min_of_remaining_and_budget():
    # FCFS: the running request arrived first.
    waiting = [view("w", 5.0, 10)]
    assert plan(FCFS, [view("r", 0.0, 1000, computed=100)], waiting) == {"r": 256}
    assert plan(FCFS, [view("r", 0.0, 1000, computed=970)], waiting) == {"r": 30}
    # Aging: r value 0 + 40 = 40 < w value 100 + 10 = 110.
    assert plan(AGING, [view("r", 0.0, 40)], [view("w", 100.0, 10)], decode=6) == {"r": 40}


def test_waiting_ranked_above_running_takes_its_share_first():
    # Aging: r value 0 + 300 = 300; w value 1 + 50 = 51 -> w first.
    running = [view("r", 0.0, 500, computed=200)]
    waiting = [view("w", 1.0, 50)]
    # 256 - 6 decode = 250; w takes 50; r gets 200 (of its 300).
    assert plan(AGING, running, waiting, decode=6) == {"r": 200}


def test_waiting_ranked_above_running_can_take_everything():
    running = [view("r", 0.0, 500, computed=200)]  # value 300
    waiting = [view("w", 1.0, 260)]  # value 261 -> first, takes min(260, 250) = 250
    assert plan(AGING, running, waiting, decode=6) == {"r": 0}


def test_interleaved_running_and_waiting_fcfs():
    # r1 (a=0, 100 left), w (a=1, 80), r2 (a=2, 500): 100 + 80 + 76 = 256.
    running = [view("r2", 2.0, 500), view("r1", 0.0, 150, computed=50)]  # any order
    waiting = [view("w", 1.0, 80), view("w-late", 3.0, 10)]
    assert plan(FCFS, running, waiting) == {"r1": 100, "r2": 76}


def test_several_waiting_ahead_then_running_gets_the_rest():
    running = [view("r", 10.0, 1000)]
    waiting = [view("w1", 1.0, 100), view("w2", 2.0, 100), view("w3", 3.0, 100)]
    # 256: w1 100, w2 100, w3 56, r 0.
    assert plan(FCFS, running, waiting) == {"r": 0}
    # 400: w1 100, w2 100, w3 100, r 100.
    assert plan(FCFS, running, waiting, budget=400) == {"r": 100}


def test_leftover_budget_is_split_among_running_in_policy_order():
    running = [view("r3", 3.0, 500), view("r1", 1.0, 100), view("r2", 2.0, 100)]
    # 256: r1 100, r2 100, r3 56.
    assert plan(FCFS, running, []) == {"r1": 100, "r2": 100, "r3": 56}
    # Aging orders by value: r1 101, r2 102, r3 503 -> same here; with a smaller r3:
    running = [view("r3", 3.0, 20), view("r1", 1.0, 200), view("r2", 2.0, 100)]
    # values r3 23, r2 102, r1 201: r3 20, r2 100, r1 136.
    assert plan(AGING, running, []) == {"r3": 20, "r2": 100, "r1": 136}


# --------------------------------------------------------------------------- slots


def test_no_free_slots_means_waiting_takes_no_budget():
    running = [view("r", 0.0, 500, computed=200)]  # aging value 300
    waiting = Counting([view("w", 1.0, 50)])  # value 51, would go first
    assert plan(AGING, running, waiting, decode=6, slots=0) == {"r": 250}
    assert waiting.pulled == 0


def test_free_slots_bound_how_many_waiting_take_budget():
    running = [view("r", 10.0, 1000)]
    waiting = Counting([view(f"w{i}", float(i), 50) for i in range(5)])  # all ahead of r
    # Two slots: w0 50, w1 50, then r 156; w2.. are not admissible and not pulled.
    assert plan(FCFS, running, waiting, slots=2) == {"r": 156}
    assert waiting.pulled == 2


# --------------------------------------------------------------------------- KV room


def test_waiting_that_does_not_fit_stops_admission_full_sequence():
    running = [view("r", 0.0, 500, computed=200)]  # aging value 300, 300 left
    waiting = [view("w", 1.0, 50)]  # value 51: ahead, needs 50 > 40 free
    assert plan(AGING, running, waiting, decode=6, kv=40) == {"r": 250}
    assert plan(AGING, running, waiting, decode=6, kv=50) == {"r": 200}


def test_full_sequence_must_fit_uses_whole_prompt_else_only_the_chunk():
    running = [view("r", 10.0, 300)]  # FCFS: behind w
    waiting = [view("w", 0.0, 400)]  # chunk min(400, 256) = 256; whole prefill 400
    # 300 KV tokens free: the whole 400 does not fit, so r takes the budget.
    assert plan(FCFS, running, waiting, kv=300, full=True) == {"r": 256}
    # Only the 256-token chunk must fit: w is admitted and takes all of it.
    assert plan(FCFS, running, waiting, kv=300, full=False) == {"r": 0}
    # With less room than the chunk, neither mode admits it.
    assert plan(FCFS, running, waiting, kv=255, full=False) == {"r": 256}


def test_a_cached_prefix_counts_against_the_room_to_admit():
    """vLLM counts a cached block nobody holds against the free blocks when it admits a
    request: a waiting request whose 100 uncached tokens fit, but whose 300 cached ones
    may not, must not take the budget from a running prefill (the step would schedule
    nothing: vLLM refuses the admission and the plan gave the running prefill 0)."""
    running = [view("r", 10.0, 300, computed=100)]  # FCFS: behind w
    cached = RequestView("w", 0.0, 400, cached_tokens=300)  # 100 left to compute
    for full in (True, False):
        assert plan(FCFS, running, [cached], kv=250, full=full) == {"r": 200}
        assert plan(FCFS, running, [cached], kv=400, full=full) == {"r": 156}
    # Each policy's chunk rule walks the same way (``CandidateWalk``).
    walk_plan = plan_prefill_caps(FCFS, running, [cached], decode_tokens=0, token_budget=256,
                                  free_slots=10, free_kv_tokens=250,
                                  full_sequence_must_fit=True, rule=_Greedy())
    assert walk_plan == {"r": 200}


class _Greedy:
    """A chunk rule that takes every bound (the walk's admission check alone decides)."""

    def choose(self, view: RequestView, bound: int, walk) -> int:
        return bound


def test_first_waiting_that_does_not_fit_blocks_later_ones():
    # vLLM stops at the first waiting request it cannot allocate, even if a later one fits.
    running = [view("r", 3.0, 300)]
    waiting = [view("w1", 1.0, 400), view("w2", 2.0, 10)]
    assert plan(FCFS, running, waiting, kv=300) == {"r": 256}


def test_kv_room_is_reduced_by_running_chunks_ranked_ahead():
    # r1 (a=0) takes 100 of 150 free KV tokens; w (a=1) needs 80 > 50 -> stop;
    # r2 (a=2) gets the remaining 156 of the budget.
    running = [view("r1", 0.0, 100), view("r2", 2.0, 500)]
    waiting = [view("w", 1.0, 80)]
    assert plan(FCFS, running, waiting, kv=150) == {"r1": 100, "r2": 156}
    # With 180 free it fits: r1 100, w 80, r2 76.
    assert plan(FCFS, running, waiting, kv=180) == {"r1": 100, "r2": 76}


# --------------------------------------------------------------------------- laziness


def test_nothing_pulled_without_running_prefills():
    waiting = Counting([view(f"w{i}", float(i), 10) for i in range(1000)])
    assert plan(FCFS, [], waiting) == {}
    assert waiting.pulled == 0


def test_running_ranked_first_pulls_only_one_waiting_to_compare():
    running = [view("r", 0.0, 100)]
    waiting = Counting([view(f"w{i}", 1.0 + i, 10) for i in range(1000)])
    assert plan(FCFS, running, waiting) == {"r": 100}
    assert waiting.pulled == 1


def test_pulls_only_up_to_the_last_running_prefill():
    # w0, w1 rank before r; w2 is needed only to see that r comes next.
    running = [view("r", 1.5, 100)]
    waiting = Counting([view(f"w{i}", float(i), 10) for i in range(1000)])
    assert plan(FCFS, running, waiting) == {"r": 100}
    assert waiting.pulled == 3


def test_pulls_stop_once_the_budget_is_gone():
    running = [view("r", 100.0, 100)]
    # w0 alone takes the whole 256: nothing else can get budget.
    waiting = Counting([view(f"w{i}", float(i), 1000) for i in range(1000)])
    assert plan(FCFS, running, waiting) == {"r": 0}
    # One would do; the merge looks at the next candidate before the loop sees the
    # budget is gone, so allow that one more.
    assert waiting.pulled <= 2


def test_pulls_stop_at_a_waiting_request_that_does_not_fit():
    running = [view("r", 100.0, 100)]
    waiting = Counting([view(f"w{i}", float(i), 1000) for i in range(1000)])
    assert plan(FCFS, running, waiting, kv=10) == {"r": 100}
    assert waiting.pulled == 1


def test_waiting_generator_is_consumed_lazily():
    # The adapter passes a generator over a heap; check it really is lazy end to end.
    pulled: list[str] = []

    def gen():
        for i in range(10**6):
            pulled.append(f"w{i}")
            yield view(f"w{i}", float(i), 10)

    running = [view("r", 2.5, 10_000)]
    assert plan(FCFS, running, gen()) == {"r": 256 - 30}
    assert pulled[:3] == ["w0", "w1", "w2"]
    assert len(pulled) <= 4


# --------------------------------------------------------------------------- property check


def reference_plan(policy, running, waiting, decode, budget, slots, kv, full):
    """The plan's documented semantics, written the obvious way (whole lists, one sort)."""
    left = max(budget - decode, 0)
    caps = {v.request_id: 0 for v in running}
    if not running:
        return {}
    candidates = [(policy.key(v), 0, v) for v in running]
    candidates += [(policy.key(v), 1, v) for v in waiting[: max(slots, 0)]]
    candidates.sort(key=lambda c: (c[0], c[1]))
    admitting = True
    for _key, source, v in candidates:
        chunk = min(v.remaining_prefill, left)
        if source == 1:
            if not admitting:
                continue
            if (v.remaining_prefill if full else chunk) > kv:
                admitting = False
                continue
        else:
            caps[v.request_id] = chunk
        left -= chunk
        kv -= chunk
    return caps


def _random_case(rng: random.Random, case: int):
    policy = rng.choice([FCFS, AGING, AgingPolicy(alpha=37.5, beta=-1.0)])
    n_running = rng.randint(0, 6)
    n_waiting = rng.randint(0, 8)
    views = []
    for i in range(n_running + n_waiting):
        prompt = rng.randint(1, 600)
        computed = rng.randint(0, prompt - 1) if i < n_running else 0
        views.append(view(f"c{case}-{i}", rng.randint(0, 40) / 4, prompt, computed))
    running = views[:n_running]
    rng.shuffle(running)
    waiting = sorted(views[n_running:], key=policy.key)
    budget = rng.choice([0, 1, 16, 100, 256, 2048])
    decode = rng.randint(0, budget + 10)
    slots = rng.randint(-1, 5)
    kv = rng.choice([0, 10, 200, 1000, 10**9])
    full = rng.random() < 0.5
    return policy, running, waiting, decode, budget, slots, kv, full


def test_caps_never_exceed_budget_and_match_reference():
    rng = random.Random(20240501)
    for case in range(3000):
        policy, running, waiting, decode, budget, slots, kv, full = _random_case(rng, case)
        counting = Counting(waiting)
        caps = plan(
            policy, running, counting, decode=decode, budget=budget, slots=slots, kv=kv, full=full
        )
        context = (case, policy.name, decode, budget, slots, kv, full)
        if running:
            assert set(caps) == {v.request_id for v in running}, context
        else:
            assert caps == {}, context
        assert all(0 <= cap for cap in caps.values()), context
        assert sum(caps.values()) <= max(budget - decode, 0), context
        for v in running:
            assert caps[v.request_id] <= v.remaining_prefill, context
        assert counting.pulled <= max(slots, 0), context
        assert caps == reference_plan(policy, running, waiting, decode, budget, slots, kv, full), (
            context
        )


def test_running_alone_uses_all_the_budget_it_can():
    rng = random.Random(99)
    for _ in range(500):
        running = [view(f"r{i}", float(i), rng.randint(2, 500)) for i in range(rng.randint(1, 5))]
        budget = rng.randint(1, 1500)
        caps = plan(FCFS, running, [], budget=budget)
        assert sum(caps.values()) == min(budget, sum(v.remaining_prefill for v in running))


# --------------------------------------------------------------------------- with a chunk rule


class BudgetRule:
    """The token-budget rule as a chunk rule: every candidate takes its bound."""

    def __init__(self) -> None:
        self.offered: list[tuple[str, int]] = []

    def choose(self, view: RequestView, bound: int, walk) -> int:
        self.offered.append((view.request_id, bound))
        return bound


def test_the_rule_path_with_the_budget_rule_caps_running_prefills_as_without_a_rule():
    rng = random.Random(77)
    for case in range(2000):
        policy, running, waiting, decode, budget, slots, kv, full = _random_case(rng, case)
        rule = BudgetRule()
        caps = plan_prefill_caps(policy, running, iter(waiting), decode, budget, slots, kv,
                                 full, rule=rule)
        without = plan(policy, running, waiting, decode=decode, budget=budget, slots=slots,
                       kv=kv, full=full)
        assert {v.request_id: caps[v.request_id] for v in running} == without, case
        admitted = [rid for rid, _ in rule.offered if rid not in without]
        assert admitted == [v.request_id for v in waiting][: len(admitted)], case  # in order
        assert sum(caps.values()) <= max(budget - decode, 0), case


class LookingAhead:
    """Lists the walk ahead at every candidate under its own assumption (a chunk derived
    from the request id), then takes that chunk, or deviates at chosen candidates."""

    def __init__(self, deviate_at: set[int]) -> None:
        self.deviate_at = deviate_at
        self.listings: list[list[tuple[str, int]]] = []
        self.offered: list[tuple[str, int]] = []

    @staticmethod
    def assume(view: RequestView, bound: int) -> int:
        return min(bound, int(view.request_id.rsplit("-", 1)[1]) * 7 % 50)

    def choose(self, view: RequestView, bound: int, walk) -> int:
        listing = walk.upcoming(self.assume)
        assert listing[0] == (view, bound)
        self.listings.append([(v.request_id, b) for v, b in listing])
        self.offered.append((view.request_id, bound))
        chunk = self.assume(view, bound)
        return bound - chunk if len(self.offered) - 1 in self.deviate_at else chunk


def test_upcoming_lists_exactly_the_candidates_the_walk_then_meets():
    rng = random.Random(5)
    for case in range(1500):
        policy, running, waiting, decode, budget, slots, kv, full = _random_case(rng, case)
        rule = LookingAhead(deviate_at={rng.randint(0, 6)} if rng.random() < 0.5 else set())
        plan_prefill_caps(policy, running, iter(waiting), decode, budget, slots, kv, full,
                          rule=rule)
        for index, listing in enumerate(rule.listings):
            # Up to and including the first deviation from the assumption, the walk
            # meets what the listing said.
            deviations = [d for d in rule.deviate_at if d >= index]
            end = min(deviations) - index + 1 if deviations else len(listing)
            assert rule.offered[index : index + end] == listing[:end], case
            if not deviations:
                assert rule.offered[index:] == listing, case


def test_looking_ahead_pulls_waiting_requests_only_as_far_as_it_looks():
    pulled: list[str] = []

    def gen():
        for i in range(10**6):
            pulled.append(f"w-{i}")
            yield view(f"w-{i}", float(i), 10)

    class LookThree:
        def choose(self, view, bound, walk):
            seen = []
            walk.upcoming(lambda v, b: None if len(seen) == 3 else seen.append(v) or 1)
            return 1

    caps = plan_prefill_caps(FCFS, [], gen(), 0, 5, 10**6, 10**9, rule=LookThree())
    assert caps == {f"w-{i}": 1 for i in range(5)}
    assert len(pulled) <= 5 + 3
