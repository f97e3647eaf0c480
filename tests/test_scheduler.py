"""The real vLLM scheduler with the fairsched adapter, driven by fake model outputs."""

from __future__ import annotations

import itertools
import random

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.sim.fake_engine import (  # noqa: E402
    OfflineEngine,
    make_request,
    make_scheduler,
)
from fairsched_plugin.adapter.request_views import has_prefill_work, request_view  # noqa: E402
from scheduler_driver import assert_nothing_left, run_workload, scheduler_engine  # noqa: E402

BUDGET = 256
# A fixed alpha: the default (automatic) alpha orders by arrival until it has measured
# the engine, which these scenarios are too short for.
AGING = {"fairsched": {"policy": "aging", "aging": {"alpha": 37.5}}}
FCFS = {"fairsched": {"policy": "fcfs"}}
GUARDED_SRPF = {"fairsched": {"policy": "guarded-srpf",
                              "guarded_srpf": {"slack": 1.0, "tail_window": 0, "overtake_running": True}}}
AGING_DECODES_FIRST = {"fairsched": {**AGING["fairsched"], "decodes_first": True}}


def _engine(model_dir, cls=FairScheduler, config=AGING, **kwargs) -> OfflineEngine:
    return scheduler_engine(model_dir, config["fairsched"], cls, budget=BUDGET, **kwargs)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_short_request_overtakes_running_long_prefill(config_only_model, cls):
    """§3.1.3: a short request arriving behind a long partial prefill is served first."""
    engine = _engine(config_only_model, cls)
    engine.add([make_request("long", 2000, 4, arrival_time=100.0)])
    first = engine.step().output.num_scheduled_tokens
    assert first == {"long": BUDGET}
    engine.add([make_request("short", 100, 4, arrival_time=100.5)])
    second = engine.step().output.num_scheduled_tokens
    assert second == {"short": 100, "long": BUDGET - 100}


def test_fcfs_policy_keeps_arrival_order(config_only_model):
    engine = _engine(config_only_model, config=FCFS)
    engine.add([make_request("long", 2000, 4, arrival_time=100.0)])
    engine.step()
    engine.add([make_request("short", 100, 4, arrival_time=100.5)])
    assert engine.step().output.num_scheduled_tokens == {"long": BUDGET}


def test_decodes_are_served_before_any_prefill(config_only_model):
    engine = _engine(config_only_model)
    engine.add([make_request(f"d{i}", 20, 50, arrival_time=100.0 + i) for i in range(3)])
    engine.step()
    engine.step()
    engine.add([make_request("long", 5000, 4, arrival_time=50.0)])
    for _ in range(5):
        scheduled = engine.step().output.num_scheduled_tokens
        assert all(scheduled.get(f"d{i}") == 1 for i in range(3))
        assert scheduled["long"] == BUDGET - 3


def _two_long_prefills_and_a_decode(engine: OfflineEngine) -> None:
    """long-a (partial), then dec (admitted behind it), then long-b."""
    engine.add([make_request("long-a", 3000, 4, arrival_time=1.0)])
    engine.step()
    engine.add([make_request("dec", 10, 100, arrival_time=2.0)])
    engine.step()
    engine.add([make_request("long-b", 2000, 4, arrival_time=3.0)])
    for _ in range(3):
        engine.step()


def test_decodes_first_switch_puts_decodes_then_prefills_by_key(config_only_model):
    """The chunked-prefill paper's service (``decodes_first``): vLLM appends admitted requests, so a
    decode admitted after a long partial prefill would sit behind it; the switch moves decodes to
    the front and sorts prefills."""
    engine = _engine(config_only_model, config=AGING_DECODES_FIRST, max_num_batched_tokens=64)
    scheduler = engine.scheduler
    _two_long_prefills_and_a_decode(engine)
    order = [r.request_id for r in scheduler.running]
    assert order[0] == "dec"
    kinds = [has_prefill_work(r, r.num_computed_tokens) for r in scheduler.running]
    assert kinds == sorted(kinds), "decodes must precede partial prefills"
    prefill_keys = [
        scheduler.fairsched_policy.key(request_view(r))
        for r in scheduler.running
        if has_prefill_work(r, r.num_computed_tokens)
    ]
    assert len(prefill_keys) == 2 and prefill_keys == sorted(prefill_keys)


def test_without_decodes_first_vllm_running_order_stays_and_budget_follows_the_key(
    config_only_model,
):
    """By default the running list keeps vLLM's admission order; the caps alone make the
    budget flow in key order (decodes, then the shorter long-b before long-a)."""
    engine = _engine(config_only_model, max_num_batched_tokens=64)
    scheduler = engine.scheduler
    _two_long_prefills_and_a_decode(engine)
    assert [r.request_id for r in scheduler.running] == ["long-a", "dec", "long-b"]
    scheduled = engine.step().output.num_scheduled_tokens
    assert scheduled == {"dec": 1, "long-b": 63}


def _random_workload(seed: int, count: int) -> list[tuple[int, object]]:
    """(step at which to add, request) pairs with a heavy-tailed prompt mix."""
    rng = random.Random(seed)
    plan = []
    for i in range(count):
        prompt = rng.choice([rng.randint(5, 120), rng.randint(120, 1000), rng.randint(1000, 3000)])
        request = make_request(
            f"r{i}", prompt, rng.randint(1, 40), arrival_time=1000.0 + i * 0.05
        )
        plan.append((rng.randint(0, 60), request))
    return sorted(plan, key=lambda item: item[0])


def _run_checked(engine: OfflineEngine, workload, *, max_num_seqs: int, abort_every: int = 0):
    """Step through ``workload``, checking vLLM's limits on every step."""

    def check(record) -> None:
        assert len(engine.scheduler.running) <= max_num_seqs
        assert all(n >= 1 for n in record.output.num_scheduled_tokens.values())

    return run_workload(engine, workload, budget=BUDGET, abort_every=abort_every, check=check)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
@pytest.mark.parametrize("config", [AGING, FCFS] + [{"fairsched": {"policy": name}} for name in
                                                  ("guarded-aging", "preflow", "hrrn")],
                         ids=["aging", "fcfs", "guarded-aging", "preflow", "hrrn"])
def test_random_workload_respects_limits_and_finishes(config_only_model, cls, config):
    engine = _engine(config_only_model, cls, config, max_num_seqs=8, num_blocks=4000)
    workload = _random_workload(seed=7, count=60)
    _run_checked(engine, workload, max_num_seqs=8)
    finished = {r for r, _ in _outputs_of(engine)}
    assert finished == {request.request_id for _, request in workload}
    assert_nothing_left(engine, 4000)


def _outputs_of(engine: OfflineEngine):
    """(request id, sampled token count) for every sampled token the fake model produced."""
    for record in engine.steps:
        for req_id, tokens in record.sampled.items():
            if tokens:
                yield req_id, len(tokens)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_aborts_leave_no_blocks_or_queue_entries(config_only_model, cls):
    engine = _engine(config_only_model, cls, max_num_seqs=8, num_blocks=4000)
    aborted = _run_checked(
        engine, _random_workload(seed=3, count=60), max_num_seqs=8, abort_every=5
    )
    assert aborted, "the scenario must abort some requests"
    assert_nothing_left(engine, 4000)


class _VictimRecordingScheduler(FairScheduler):
    """Records, for each preemption, whether a better-ranked prefill was the victim."""

    def _preempt_request(self, request, timestamp, drop_stale_output=False):
        if has_prefill_work(request, request.num_computed_tokens):
            key = self.fairsched_policy.key(request_view(request))
            others = [
                self.fairsched_policy.key(request_view(r))
                for r in self.running
                if r is not request and has_prefill_work(r, r.num_computed_tokens)
            ]
            self.victims.append((request.request_id, all(key >= k for k in others)))
        else:
            self.victims.append((request.request_id, not any(
                has_prefill_work(r, r.num_computed_tokens) for r in self.running)))
        super()._preempt_request(request, timestamp, drop_stale_output)


def test_preemption_takes_lowest_priority_and_leaks_nothing(config_only_model):
    """With ``decodes_first`` the running list ends in the lowest-ranked partial prefill,
    which vLLM's FCFS preemption then takes."""
    num_blocks = 120  # 1,920 tokens of KV for prompts up to 3,000: preemption is certain
    scheduler = make_scheduler(
        _VictimRecordingScheduler,
        config_only_model,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=8,
        num_blocks=num_blocks,
        additional_config=AGING_DECODES_FIRST,
    )
    scheduler.victims = []
    engine = OfflineEngine(scheduler)
    rng = random.Random(11)
    workload = [
        (rng.randint(0, 30), make_request(f"r{i}", rng.randint(100, 1500), rng.randint(20, 200),
                                          arrival_time=1000.0 + i))
        for i in range(24)
    ]
    _run_checked(engine, sorted(workload, key=lambda w: w[0]), max_num_seqs=8)
    assert scheduler.victims, "the scenario must preempt"
    assert all(lowest for _req, lowest in scheduler.victims), scheduler.victims
    finished = {r for r, _ in _outputs_of(engine)}
    assert finished == {request.request_id for _, request in workload}
    assert_nothing_left(engine, num_blocks)


def test_preemption_victim_is_the_partial_prefill_not_a_later_decode(config_only_model):
    """A long prefill admitted first sits before later decodes in vLLM's list; with
    ``decodes_first`` the victim is that prefill (the lowest-ranked running request), not
    the newest decode."""
    num_blocks = 40  # 624 tokens of KV: the long prompt plus two growing decodes overflow
    scheduler = make_scheduler(
        _VictimRecordingScheduler,
        config_only_model,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        num_blocks=num_blocks,
        additional_config=AGING_DECODES_FIRST,
    )
    scheduler.victims = []
    engine = OfflineEngine(scheduler)
    engine.add([make_request("long", 560, 4, arrival_time=1.0)])
    engine.step()
    engine.add([make_request(f"s{i}", 60, 200, arrival_time=2.0 + i) for i in range(2)])
    steps = 0
    while scheduler.has_unfinished_requests() and not scheduler.victims:
        engine.step()
        steps += 1
        assert steps < 500
    assert scheduler.victims[0] == ("long", True)
    engine.run_until_idle()
    assert_nothing_left(engine, num_blocks)


def test_without_decodes_first_the_victim_is_vllms_newest_request(config_only_model):
    """vLLM's running order is kept, so its FCFS preemption takes the newest request."""
    scheduler = make_scheduler(
        _VictimRecordingScheduler, config_only_model, max_num_batched_tokens=64,
        max_num_seqs=8, num_blocks=40, additional_config=AGING,
    )
    scheduler.victims = []
    engine = OfflineEngine(scheduler)
    engine.add([make_request("long", 560, 4, arrival_time=1.0)])
    engine.step()
    engine.add([make_request(f"s{i}", 60, 200, arrival_time=2.0 + i) for i in range(2)])
    while scheduler.has_unfinished_requests() and not scheduler.victims:
        engine.step()
    assert scheduler.victims[0][0] == "s1"
    engine.run_until_idle()
    assert_nothing_left(engine, 40)


def test_bad_config_stops_scheduler_construction(config_only_model):
    from fairsched_plugin.config import ConfigError

    with pytest.raises(ConfigError, match="aging.alpha"):
        make_scheduler(
            FairScheduler,
            config_only_model,
            additional_config={"fairsched": {"aging": {"alpha": 0}}},
        )


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_fair_scheduler_follows_vllms_scheduling_mode(config_only_model, async_scheduling):
    scheduler = make_scheduler(
        FairScheduler, config_only_model, async_scheduling=async_scheduling,
        additional_config=AGING,
    )
    assert type(scheduler) is (FairScheduler if async_scheduling else FairSyncScheduler)
    assert isinstance(scheduler, AsyncScheduler) == async_scheduling


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_trace_records_every_step(config_only_model, tmp_path, cls):
    import json

    trace = tmp_path / "trace.jsonl"
    config = {"fairsched": {"policy": "aging", "trace_path": str(trace)}}
    engine = _engine(config_only_model, cls, config, max_num_seqs=8, num_blocks=4000)
    workload = _random_workload(seed=5, count=30)
    _run_checked(engine, workload, max_num_seqs=8)
    engine.scheduler.shutdown()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    busy = [r for r in engine.steps if r.output.total_num_scheduled_tokens > 0]
    assert [r["step"] for r in records] == list(range(1, len(busy) + 1))
    for record, step in zip(records, busy):
        assert record["decode_tokens"] + record["prefill_tokens"] == (
            step.output.total_num_scheduled_tokens
        )
        assert record["prefill_tokens"] == sum(record["prefill_chunks"])
        assert record["num_decodes"] + record["num_prefills"] == len(
            step.output.num_scheduled_tokens
        )
        assert record["step_time_s"] >= 0 and record["t_done"] >= record["t"]
    done = [req_id for r in records for req_id in r["prefill_done"]]
    assert sorted(done) == sorted(request.request_id for _, request in workload)
    admitted = [req_id for r in records for req_id in r["admitted"]]
    assert sorted(admitted) == sorted(done)


def test_automatic_alpha_calibrates_and_rekeys_the_waiting_heap(config_only_model):
    # The order alone: LPRS, which learns its CPU latency model from the same steps, would
    # change the chunks (and so the measured rate) while the alpha settles.
    config = {"fairsched": {"policy": "aging", "aging": {"alpha": "auto", "auto_factor": 0.5},
                            "lprs": {"enabled": False}, "apc": {"enabled": False}}}
    scheduler = make_scheduler(FairScheduler, config_only_model, max_num_seqs=4,
                               num_blocks=4000, additional_config=config)
    # 5 ms per fake forward pass: about 50,000 prefill tokens/s, alpha about 25,000.
    engine = OfflineEngine(scheduler, model_time_s=0.005)
    assert scheduler.fairsched_policy.alpha is None
    engine.add(make_request(f"r{i}", 100 + 37 * (i % 9), 8, arrival_time=1000.0 + i * 1e-3)
               for i in range(200))
    for _ in range(150):
        engine.step()
    assert scheduler._auto_alpha.estimator.steps >= 32
    policy = scheduler.fairsched_policy
    assert policy.alpha is not None
    assert policy.alpha == pytest.approx(0.5 * scheduler._auto_alpha.estimator.rate, rel=0.2)
    # Every waiting request sits under the key the current alpha gives it, re-keyed from
    # the view the queue took when it entered, which is the request's view now.
    for request, (entry, _timed, _work, snapshot, _position) in scheduler.waiting._entries.items():
        assert snapshot == scheduler._view(request)
        assert tuple(entry[:-2]) == policy.key(request_view(request))
    popped = [scheduler.waiting.pop_request() for _ in range(len(scheduler.waiting))]
    keys = [policy.key(request_view(r)) for r in popped]
    assert keys == sorted(keys)


# --------------------------------------------------------------------------- fcfs control


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_fcfs_schedules_exactly_as_stock_vllm(config_only_model, async_scheduling):
    """The control arm: the same workload gives stock vLLM's schedule, step for step, with
    aborts and preemption (a small KV cache), because fcfs neither reorders nor plans."""
    from vllm.v1.core.sched.scheduler import Scheduler

    stock_cls = AsyncScheduler if async_scheduling else Scheduler
    schedules = []
    for cls, config in ((stock_cls, None), (FairScheduler, FCFS)):
        scheduler = make_scheduler(
            cls, config_only_model, max_num_batched_tokens=BUDGET, max_num_seqs=8,
            num_blocks=300, async_scheduling=async_scheduling, additional_config=config,
        )
        engine = OfflineEngine(scheduler)
        run_workload(engine, _random_workload(seed=13, count=60), budget=BUDGET, abort_every=7)
        schedules.append([dict(r.output.num_scheduled_tokens) for r in engine.steps])
        if cls is FairScheduler:
            assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 299
    stock, fcfs = schedules
    assert len(stock) == len(fcfs) and stock == fcfs


def test_fcfs_with_decodes_first_serves_decodes_before_a_running_prefill(config_only_model):
    """The chunked-prefill paper's service as a switch on the control: a decode admitted behind a
    partial prefill still gets its token before the prefill takes the rest of the budget."""
    results = {}
    for decodes_first in (False, True):
        config = {"fairsched": {"policy": "fcfs", "decodes_first": decodes_first}}
        engine = _engine(config_only_model, config=config, max_num_batched_tokens=64)
        # vLLM's per-request cap lets a request be admitted behind a running prefill.
        engine.scheduler.scheduler_config.long_prefill_token_threshold = 32
        engine.add([make_request("long-a", 3000, 4, arrival_time=1.0)])
        engine.step()
        engine.add([make_request("dec", 10, 100, arrival_time=2.0)])
        engine.step()
        scheduled = engine.step().output.num_scheduled_tokens
        results[decodes_first] = ([r.request_id for r in engine.scheduler.running], scheduled)
    assert results[False] == (["long-a", "dec"], {"long-a": 32, "dec": 1})
    assert results[True] == (["dec", "long-a"], {"dec": 1, "long-a": 32})


# --------------------------------------------------------------------------- guarded-srpf


def _guarded_engine(model_dir, slack: float, window_s: float = 0.0,
                    size_allowance: float = 0.0) -> OfflineEngine:
    config = {"fairsched": {"policy": "guarded-srpf",
                            "guarded_srpf": {"slack": slack, "window_s": window_s,
                                             "size_allowance": size_allowance,
                                             "tail_window": 0, "overtake_running": True}}}
    return _engine(model_dir, config=config, max_num_batched_tokens=64)


def test_guarded_srpf_lets_short_requests_overtake_until_the_deadline(config_only_model):
    import time

    # long arrives at an idle engine, but a burst 1 s ago had 1,000 tokens queued, so long
    # may wait until 1,000 prefill tokens have been served; a short request behind it is
    # served first.
    engine = _guarded_engine(config_only_model, slack=1.0, window_s=30.0)
    now = time.time()
    engine.scheduler.fairsched_policy.observe_backlog(now - 1.0, 1000)
    engine.add([make_request("long", 2000, 4, arrival_time=now)])
    engine.step()
    engine.add([make_request("short", 40, 4, arrival_time=now + 0.01)])
    assert engine.step().output.num_scheduled_tokens == {"short": 40, "long": 24}
    deadlines = engine.scheduler._deadlines
    assert deadlines["long"] == 1000
    # 64 tokens served, then the window's largest backlog: 2,000 while long waited.
    assert deadlines["short"] == 64 + 2000


def test_guarded_srpf_serves_an_overdue_request_before_shorter_ones(config_only_model):
    # Nothing was queued when long arrived: it is overdue at once, so it keeps the budget.
    engine = _guarded_engine(config_only_model, slack=1.0)
    engine.add([make_request("long", 2000, 4, arrival_time=100.0)])
    engine.step()
    engine.add([make_request("short", 40, 4, arrival_time=100.5)])
    assert engine.step().output.num_scheduled_tokens == {"long": 64}
    assert engine.scheduler.waiting.peek_request().request_id == "short"


def test_guarded_srpf_counts_every_served_prefill_token(config_only_model):
    config = {"fairsched": {"policy": "guarded-srpf"}}
    scheduler = make_scheduler(FairScheduler, config_only_model, max_num_seqs=4,
                               max_num_batched_tokens=BUDGET, num_blocks=4000,
                               additional_config=config)
    engine = OfflineEngine(scheduler, model_time_s=0.002)
    prompts = [100 + 37 * (i % 9) for i in range(60)]
    engine.add(make_request(f"r{i}", n, 8, arrival_time=1000.0 + i * 1e-3)
               for i, n in enumerate(prompts))
    engine.run_until_idle()
    assert scheduler.fairsched_policy.guard.served == sum(prompts)
    assert not scheduler._deadlines
    assert_nothing_left(engine, 4000)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_guarded_srpf_random_workload_with_aborts_leaks_nothing(config_only_model, cls):
    config = {"fairsched": {"policy": "guarded-srpf"}}
    engine = _engine(config_only_model, cls, config, max_num_seqs=8, num_blocks=300)
    aborted = _run_checked(engine, _random_workload(seed=21, count=60), max_num_seqs=8,
                           abort_every=6)
    assert aborted
    assert not engine.scheduler._deadlines
    assert engine.scheduler.waiting.work == 0
    assert_nothing_left(engine, 300)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
@pytest.mark.parametrize("threshold", [0, 96])
@pytest.mark.parametrize("config", [AGING, GUARDED_SRPF], ids=["aging", "guarded-srpf"])
def test_skipping_the_plan_when_vllm_order_serves_it_changes_no_decision(
        config_only_model, cls, threshold, config):
    """The plan is skipped on steps where vLLM's own loop gives each running prefill what
    the plan would cap it to; the schedule must be the one the full plan gives, step by
    step, and the skip must actually happen on this workload. With deadlines (the guard,
    without the automatic alpha so that both runs decide alike) the queue's head is
    compared by its queued key or its deadline."""
    skipped = []

    def engine(skip: bool) -> OfflineEngine:
        built = _engine(config_only_model, cls, config, max_num_seqs=8, num_blocks=4000,
                        long_prefill_token_threshold=threshold)
        check = built.scheduler._running_order_is_plan_order

        def counted(*args) -> bool:
            verdict = check(*args)
            skipped.append(verdict)
            return verdict and skip

        built.scheduler._running_order_is_plan_order = counted
        return built

    schedules = []
    for skip in (True, False):
        planned = engine(skip)
        _run_checked(planned, _random_workload(seed=11, count=60), max_num_seqs=8)
        schedules.append([record.output.num_scheduled_tokens for record in planned.steps])
    assert schedules[0] == schedules[1]
    assert any(skipped) and not all(skipped)


def _vouching_checked(cls: type, verdicts: list[tuple[bool, bool]]) -> type:
    """``cls`` whose every "still ahead" answer (the order check's memory) is checked
    against the full check, made with that memory cleared: ``verdicts`` gets both
    answers. (An assertion here would be caught: a failing step runs as stock vLLM.)"""

    def _still_ahead(self, prefills, state) -> bool:
        verdict = cls._still_ahead(self, prefills, state)
        if verdict:
            memory, self._ahead = self._ahead, None
            verdicts.append((verdict, self._running_order_is_plan_order(prefills, {}, state)))
            self._ahead = memory
        else:
            verdicts.append((verdict, verdict))
        return verdict

    return type(f"Vouching{cls.__name__}", (cls,), {"_still_ahead": _still_ahead})


def _shared_prefix_workload(seed: int, count: int) -> list[tuple[int, object]]:
    """Like :func:`_random_workload`, but a third of the prompts extend one of a few
    common prefixes, so that waiting requests count cached tokens."""
    rng = random.Random(seed)
    prefixes = [[(31 * k + 7 * i) % 991 + 2 for i in range(rng.randint(200, 900))]
                for k in range(3)]
    plan = []
    for i, (step, request) in enumerate(_random_workload(seed, count)):
        if i % 3 == 0:
            ids = rng.choice(prefixes) + [(i + j) % 991 + 2 for j in range(rng.randint(1, 300))]
            request = make_request(f"p{i}", 0, rng.randint(1, 40),
                                   arrival_time=request.arrival_time, prompt_token_ids=ids)
        plan.append((step, request))
    return plan


def _preempting_workload(seed: int, count: int) -> list[tuple[int, object]]:
    """Prompts of 100-1,500 tokens with outputs of 20-200: in 120 blocks (1,920 tokens)
    vLLM must preempt (as in the preemption tests above)."""
    rng = random.Random(seed)
    return sorted(((rng.randint(0, 30),
                    make_request(f"r{i}", rng.randint(100, 1500), rng.randint(20, 200),
                                 arrival_time=1000.0 + i))
                   for i in range(count)), key=lambda item: item[0])


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
@pytest.mark.parametrize("config", [AGING, GUARDED_SRPF, {"fairsched": {"policy": "guarded-aging"}}],
                         ids=["aging", "guarded-srpf", "guarded-aging"])
@pytest.mark.parametrize("scenario", ["arrivals", "aborts", "preemptions", "prefix-cache"])
def test_remembered_order_check_agrees_with_the_full_check(config_only_model, cls, config,
                                                          scenario):
    """Between steps the order check remembers that the one running prefill is ahead of
    every waiting request, until a request enters a queue or keys are taken again. Each
    time that memory answers, the full check must agree; and the schedule must be the
    one the full check alone gives, step by step. Arrivals, aborts, preemptions (a small
    KV cache) and prefix-cache hits each change what the memory must notice. Both runs
    read one virtual clock (a millisecond per call): the policy's epoch comes from it,
    and two epochs can round a near-tie of keys apart."""
    num_blocks = 120 if scenario == "preemptions" else 4000
    workload = {"prefix-cache": _shared_prefix_workload,
                "preemptions": _preempting_workload}.get(scenario, _random_workload)
    verdicts: list[tuple[bool, bool]] = []
    schedules = []
    for remember in (True, False):
        checked = _vouching_checked(cls, verdicts if remember else [])
        if not remember:
            checked._still_ahead = lambda self, prefills, state: False
        ticks = itertools.count()
        engine = _engine(config_only_model, checked, config, max_num_seqs=8,
                         num_blocks=num_blocks,
                         enable_prefix_caching=scenario == "prefix-cache",
                         clock=lambda: 1000.0 + next(ticks) / 1000)
        _run_checked(engine, workload(13, 24 if scenario == "preemptions" else 60),
                     max_num_seqs=8,
                     abort_every=7 if scenario == "aborts" else 0)
        schedules.append([record.output.num_scheduled_tokens for record in engine.steps])
        if scenario == "preemptions":
            preempted = [record for record in engine.steps if record.output.preempted_req_ids]
            assert preempted, "the scenario must preempt"
    assert all(memory == full for memory, full in verdicts)
    assert schedules[0] == schedules[1]
    assert any(memory for memory, _full in verdicts), "the memory must answer here"


def test_the_order_check_remembers_nothing_for_keys_that_read_more_than_the_work(
        config_only_model):
    """PREFLOW's key counts a waiting request's cached prefix but not a running
    prefill's, so a request admitted from the head of the queue can rank behind what it
    left there: every step needs the full check."""
    verdicts: list[tuple[bool, bool]] = []
    engine = _engine(config_only_model, _vouching_checked(FairScheduler, verdicts),
                     {"fairsched": {"policy": "preflow"}}, max_num_seqs=8, num_blocks=4000)
    _run_checked(engine, _random_workload(seed=13, count=60), max_num_seqs=8)
    assert engine.scheduler._ahead is None and not any(memory for memory, _ in verdicts)


def test_a_request_admitted_with_less_cached_than_it_queued_with_is_checked_again(
        config_only_model):
    """A request queued while its prefix is cached ranks by the little work left; if the
    prefix is evicted before it is admitted, it runs with more work than it queued with,
    and a request queued behind it can rank ahead of it again. The order check's memory
    must then not vouch for it as the new head of the running prefills.

    P (600 tokens) is computed and cached; two long decodes hold two of three slots;
    ``early`` (an old, long prompt), ``w`` (P plus 50 tokens) and ``x`` (100 tokens, a
    second after ``w``) arrive together. ``early`` takes the third slot and its blocks
    evict most of P; when it finishes, ``w`` is admitted with a fraction of P cached."""
    prefix = [(13 * i) % 991 + 2 for i in range(600)]
    verdicts: list[tuple[bool, bool]] = []
    ticks = itertools.count()
    engine = _engine(config_only_model, _vouching_checked(FairScheduler, verdicts), AGING,
                     max_num_seqs=3, num_blocks=60, enable_prefix_caching=True,
                     clock=lambda: 1000.0 + next(ticks) / 1000)
    scheduler = engine.scheduler
    engine.add([make_request("p", 0, 1, 900.0, prompt_token_ids=prefix)])
    while scheduler.has_unfinished_requests():
        engine.step()
    engine.add([make_request("d1", 16, 300, 901.0), make_request("d2", 16, 300, 901.0)])
    engine.step()
    engine.add([make_request("early", 700, 1, 902.0),
                make_request("w", 0, 4, 1000.0, prompt_token_ids=prefix + [5] * 50),
                make_request("x", 100, 4, 1001.0)])
    queued_cached = scheduler._cached_prefix["w"]
    assert queued_cached >= 512
    checks: list[tuple[list[str], bool]] = []
    check = scheduler._running_order_is_plan_order

    def recorded(prefills, views, state) -> bool:
        verdict = check(prefills, views, state)
        checks.append(([r.request_id for r in prefills], verdict))
        return verdict

    scheduler._running_order_is_plan_order = recorded
    while "w" not in (scheduled := engine.step().output.num_scheduled_tokens):
        pass
    admitted_with = scheduler.requests["w"].num_computed_tokens - scheduled["w"]
    assert admitted_with + scheduled["w"] < queued_cached, "most of P must be evicted"
    while any(r.request_id in ("w", "x") for r in scheduler.running) or scheduler.waiting:
        engine.step()
    assert (["w"], False) in checks, "x must rank ahead of the running w again"
    assert all(memory == full for memory, full in verdicts)
    assert any(memory for memory, _full in verdicts), "the memory must answer before w"
