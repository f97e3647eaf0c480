"""``decode_share``: holding back the newest decodes while prefill work waits, as a pure
rule and in the real vLLM scheduler driven by fake model outputs."""

from __future__ import annotations

import itertools
import random

import pytest

pytest.importorskip("vllm")

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.config import ConfigError, from_values  # noqa: E402
from fairsched_plugin.policies.decode_hold import (  # noqa: E402
    decode_cap,
    decodes_to_hold,
    newest_within_tpot,
)
from fairsched_plugin.sim.fake_engine import (  # noqa: E402
    OfflineEngine,
    make_request,
)
from scheduler_driver import assert_nothing_left, run_workload, scheduler_engine  # noqa: E402

BUDGET = 64


def test_the_cap_is_a_share_of_the_budget_in_decodes_and_never_zero():
    assert decode_cap(0.25, 64, 1) == 16
    assert decode_cap(0.25, 64, 4) == 4  # each decode carries 3 draft tokens
    assert decode_cap(0.01, 64, 1) == 1


def test_decodes_are_held_only_as_far_as_waiting_prefill_work_uses_their_budget():
    # 20 decodes in a 64-token budget leave 44 for prefills; the cap of 16 would leave 48.
    assert decodes_to_hold(20, 1, prefill_work=1000, token_budget=64, cap=16) == 4
    assert decodes_to_hold(20, 1, prefill_work=46, token_budget=64, cap=16) == 2
    assert decodes_to_hold(20, 1, prefill_work=44, token_budget=64, cap=16) == 0
    assert decodes_to_hold(20, 1, prefill_work=0, token_budget=64, cap=16) == 0
    assert decodes_to_hold(16, 1, prefill_work=1000, token_budget=64, cap=16) == 0
    # Speculative decoding: a held decode frees 1 + k tokens.
    assert decodes_to_hold(10, 4, prefill_work=1000, token_budget=64, cap=4) == 6
    assert decodes_to_hold(10, 4, prefill_work=30, token_budget=64, cap=4) == 2


def test_decode_share_is_validated():
    assert from_values({"decode_share": 0.3}).decode_share == 0.3
    assert from_values({}).decode_share == 0
    with pytest.raises(ConfigError, match="decode_share must be a number >= 0 and < 1"):
        from_values({"decode_share": 1})
    with pytest.raises(ConfigError, match="decode_share needs service"):
        from_values({"decode_share": 0.3, "service": "ranked"})


def test_under_a_tpot_bound_the_newest_decodes_still_within_it_are_held():
    # Oldest first: (seconds since the first decode step, tokens generated since).
    times = [(1.0, 50), (0.5, 2), (0.3, 10), (0.0, 0)]
    # Time per token: 0.02, 0.25, 0.03 and (no token yet) 0 s.
    assert newest_within_tpot(times, hold=2, max_tpot_s=0.1) == [3, 2]
    assert newest_within_tpot(times, hold=3, max_tpot_s=0.1) == [3, 2, 0]
    assert newest_within_tpot(times, hold=9, max_tpot_s=0.01) == [3]
    assert newest_within_tpot(times, hold=2, max_tpot_s=1.0) == [3, 2]
    assert newest_within_tpot(times, hold=0, max_tpot_s=1.0) == []
    # A decode with no token yet may wait one bound's length, and no longer.
    assert newest_within_tpot([(0.09, 0)], hold=1, max_tpot_s=0.1) == [0]
    assert newest_within_tpot([(0.1, 0)], hold=1, max_tpot_s=0.1) == []


def test_the_tpot_bound_is_validated():
    config = from_values({"decode_share": 0.3, "decode_share_max_tpot_ms": 150})
    assert config.decode_share_max_tpot_ms == 150
    assert from_values({}).decode_share_max_tpot_ms == 0
    with pytest.raises(ConfigError, match="decode_share_max_tpot_ms must be a number >= 0"):
        from_values({"decode_share": 0.3, "decode_share_max_tpot_ms": -5})
    with pytest.raises(ConfigError, match="needs decode_share > 0"):
        from_values({"decode_share_max_tpot_ms": 150})


def _engine(model_dir, config, cls=FairSyncScheduler, **kwargs) -> OfflineEngine:
    return scheduler_engine(model_dir, config, cls, budget=BUDGET, **kwargs)


def _decoding(engine: OfflineEngine, count: int, output: int = 100) -> None:
    """``count`` short requests, stepped until every one of them decodes."""
    engine.add([make_request(f"d{i:02d}", 8, output, arrival_time=1000.0 + i)
                for i in range(count)])
    scheduler = engine.scheduler
    while len(scheduler.running) < count or any(r.is_prefill_chunk for r in scheduler.running):
        engine.step()


def test_the_newest_decodes_beyond_the_share_wait_while_a_prompt_queues(config_only_model):
    engine = _engine(config_only_model, {"policy": "fcfs", "decode_share": 0.25},
                     max_num_seqs=32)
    _decoding(engine, 20)
    scheduler = engine.scheduler
    assert len(engine.step().output.num_scheduled_tokens) == 20  # nothing waits: all served
    engine.add([make_request("long", 1000, 4, arrival_time=2000.0)])
    scheduled = engine.step().output.num_scheduled_tokens
    assert scheduled["long"] == 48  # the budget less the 16 decodes of the cap
    assert sorted(r for r in scheduled if r != "long") == [f"d{i:02d}" for i in range(16)]
    # The held decodes keep running, with their KV blocks, and count against max_num_seqs.
    assert len(scheduler.running) == 21
    assert scheduler.max_num_active_reqs == 32


def test_a_decode_past_the_tpot_bound_runs_and_the_hold_shrinks(config_only_model):
    """On a clock the test moves: d19, the newest, has made no progress for longer than
    the bound allows, so it runs, and the hold shrinks to the three others beyond the cap
    (the oldest sixteen are never held); once every held decode has reached the bound,
    none is held and all twenty run."""
    now = [0.0]
    engine = _engine(config_only_model,
                     {"policy": "fcfs", "decode_share": 0.25, "decode_share_max_tpot_ms": 100},
                     max_num_seqs=32, clock=lambda: now[0])
    _decoding(engine, 20)
    engine.step()  # every decode's clock starts here
    scheduler = engine.scheduler
    d19 = scheduler.requests["d19"]
    scheduler._decode_start["d19"] = (-1.0, d19.num_output_tokens)  # 1 s, no token since
    engine.add([make_request("long", 1000, 4, arrival_time=2000.0)])
    now[0] = 0.05
    scheduled = engine.step().output.num_scheduled_tokens
    held = {f"d{i:02d}" for i in range(20)} - set(scheduled)
    assert held == {"d16", "d17", "d18"}
    assert scheduled["long"] == 47
    # The held three got no token in that step; a second later all are past the bound.
    now[0] = 1.05
    scheduled = engine.step().output.num_scheduled_tokens
    assert {f"d{i:02d}" for i in range(20)} <= set(scheduled)
    assert scheduled["long"] == 44


def test_without_decode_share_the_same_step_serves_every_decode(config_only_model):
    engine = _engine(config_only_model, {"policy": "fcfs"}, max_num_seqs=32)
    _decoding(engine, 20)
    engine.add([make_request("long", 1000, 4, arrival_time=2000.0)])
    scheduled = engine.step().output.num_scheduled_tokens
    assert scheduled["long"] == 44 and len(scheduled) == 21


def test_held_decodes_do_not_open_slots_beyond_max_num_seqs(config_only_model):
    """20 of 22 slots are taken by decodes: holding 4 of them back must not let vLLM admit
    more than the 2 requests the free slots allow."""
    engine = _engine(config_only_model, {"policy": "fcfs", "decode_share": 0.25},
                     max_num_seqs=22)
    _decoding(engine, 20)
    engine.add([make_request(f"w{i}", 10, 4, arrival_time=2000.0 + i) for i in range(6)])
    record = engine.step()
    admitted = [r for r in record.output.num_scheduled_tokens if r.startswith("w")]
    assert admitted == ["w0", "w1"]
    assert len(engine.scheduler.running) == 22


def _counting_holds(cls: type) -> type:
    """``cls`` recording how many decodes each step held back."""

    def _hold_newest_decodes(self, throttle_prefills):
        cls._hold_newest_decodes(self, throttle_prefills)
        self.holds.append(len(self._hidden))

    return type(f"Counting{cls.__name__}", (cls,),
                {"_hold_newest_decodes": _hold_newest_decodes})


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
@pytest.mark.parametrize("policy", ["fcfs", "guarded-srpf", "guarded-aging"])
@pytest.mark.parametrize("max_tpot_ms", [0, 30])
def test_everything_finishes_with_aborts_and_nothing_leaks(config_only_model, cls, policy,
                                                           max_tpot_ms):
    num_blocks = 4000
    ticks = itertools.count()  # a clock 10 ms further on at every step
    engine = _engine(config_only_model, {"policy": policy, "decode_share": 0.1,
                                         "decode_share_max_tpot_ms": max_tpot_ms},
                     cls=_counting_holds(cls), async_scheduling=cls is FairScheduler,
                     max_num_seqs=32, num_blocks=num_blocks,
                     clock=lambda: next(ticks) * 0.01)
    scheduler = engine.scheduler
    scheduler.holds = []
    rng = random.Random(3)
    workload = sorted(
        ((rng.randint(0, 60), make_request(f"r{i}", rng.choice([6, 20, 300, 900]),
                                           rng.randint(10, 60), arrival_time=1000.0 + i))
         for i in range(60)),
        key=lambda item: item[0],
    )

    def check(_record):
        assert len(scheduler.running) <= 32
        assert not scheduler._hidden and scheduler.max_num_active_reqs == 32

    aborted = run_workload(engine, workload, budget=BUDGET, abort_every=9, check=check)
    assert aborted and max(scheduler.holds) > 0
    finished = {rid for record in engine.steps for rid, tokens in record.sampled.items()
                if tokens}
    assert finished | aborted == {request.request_id for _, request in workload}
    assert_nothing_left(engine, num_blocks)
    assert not scheduler._decode_start
