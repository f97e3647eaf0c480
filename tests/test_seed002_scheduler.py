"""The ordering-policies paper's policies and the ranked service mode in the real vLLM scheduler,
driven by fake model outputs (the pattern of vLLM's own scheduler tests)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from scheduler_driver import assert_nothing_left, run_workload, scheduler_engine  # noqa: E402
from fairsched_plugin.sim.fake_engine import (  # noqa: E402
    OfflineEngine,
    make_request,
    make_scheduler,
)

BUDGET = 256
POLICIES = ("fifo", "tier", "spf", "lpf", "srtf", "aging-spf", "estf", "af-lcb")


def _engine(model_dir, config, cls=FairScheduler, **kwargs) -> OfflineEngine:
    return scheduler_engine(model_dir, config, cls, budget=BUDGET, **kwargs)


def _workload(seed: int, count: int) -> list[tuple[int, object]]:
    """(step to add at, request): mixed prompts and outputs, two service tiers."""
    rng = random.Random(seed)
    plan = []
    for i in range(count):
        prompt = rng.choice([rng.randint(5, 120), rng.randint(120, 1000), rng.randint(1000, 2500)])
        request = make_request(f"r{i}", prompt, rng.randint(1, 60),
                               arrival_time=1000.0 + i * 0.05, priority=rng.randint(0, 1))
        plan.append((rng.randint(0, 80), request))
    return sorted(plan, key=lambda item: item[0])


def _run(engine: OfflineEngine, workload, *, abort_every: int = 0, check=None) -> set[str]:
    return run_workload(engine, workload, budget=BUDGET, abort_every=abort_every, check=check)


def _finished(engine: OfflineEngine) -> set[str]:
    return {rid for record in engine.steps for rid, tokens in record.sampled.items() if tokens}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("service", ["budget", "ranked"])
def test_every_policy_finishes_everything_with_aborts_and_leaks_nothing(
    config_only_model, policy, service
):
    engine = _engine(config_only_model, {"policy": policy, "service": service,
                                         "max_batch_size": 4},
                     max_num_seqs=8, num_blocks=4000)
    workload = _workload(seed=5, count=50)
    aborted = _run(engine, workload, abort_every=7)
    assert aborted
    assert _finished(engine) | aborted == {request.request_id for _, request in workload}
    assert_nothing_left(engine, 4000)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_ranked_serves_at_most_max_batch_size_and_everything_finishes(config_only_model, cls):
    """The paper's semantics: never more than max_batch_size requests in a step, though many
    more are running (holding KV) and waiting."""
    engine = _engine(config_only_model, {"policy": "spf", "service": "ranked",
                                         "max_batch_size": 3},
                     cls=cls, max_num_seqs=16, num_blocks=4000)
    widths = []

    def check(record):
        widths.append(len(record.output.num_scheduled_tokens))
        assert len(record.output.num_scheduled_tokens) <= 3

    workload = [(0, make_request(f"r{i}", 30 + 40 * i, 30, arrival_time=1000.0 + i))
                for i in range(12)]
    _run(engine, workload, check=check)
    assert max(widths) == 3
    assert _finished(engine) == {request.request_id for _, request in workload}
    assert_nothing_left(engine, 4000)


def test_ranked_hides_a_running_request_when_a_better_one_arrives(config_only_model):
    """A decode outranked by a new short request keeps its KV blocks but is not served."""
    engine = _engine(config_only_model, {"policy": "spf", "service": "ranked",
                                         "max_batch_size": 1},
                     cls=FairSyncScheduler, max_num_seqs=8, num_blocks=4000)
    engine.add([make_request("long", 600, 50, arrival_time=1.0)])
    for _ in range(4):
        engine.step()
    scheduler = engine.scheduler
    blocks_before = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    engine.add([make_request("short", 20, 5, arrival_time=2.0)])
    for _ in range(5):  # its prefill samples the first of 5 tokens, then four decodes
        assert set(engine.step().output.num_scheduled_tokens) == {"short"}
    assert scheduler.requests["long"].status == RequestStatus.RUNNING
    assert scheduler.requests["long"].num_computed_tokens >= 600
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() <= blocks_before
    assert set(engine.step().output.num_scheduled_tokens) == {"long"}
    engine.run_until_idle()


class _PreemptionRecorder(FairSyncScheduler):
    """Records, per preemption, whether the victim was hidden (outside the served top)."""

    def _preempt_request(self, request, timestamp, drop_stale_output=False):
        self.victims.append((request.request_id, request not in self.running))
        super()._preempt_request(request, timestamp, drop_stale_output)


def test_ranked_under_kv_pressure_preempts_hidden_requests_instead_of_stalling(
    config_only_model,
):
    num_blocks = 100  # 1,584 tokens of KV; twelve requests hold up to 12 x 400
    scheduler = make_scheduler(
        _PreemptionRecorder, config_only_model, max_num_batched_tokens=BUDGET,
        max_num_seqs=16, num_blocks=num_blocks, async_scheduling=False,
        additional_config={"fairsched": {"policy": "srtf", "service": "ranked",
                                         "max_batch_size": 2}},
    )
    scheduler.victims = []
    engine = OfflineEngine(scheduler)
    workload = [(i * 3, make_request(f"r{i}", 200, 200 - 10 * i, arrival_time=1000.0 + i))
                for i in range(12)]
    _run(engine, workload)
    assert scheduler.victims and all(hidden for _rid, hidden in scheduler.victims)
    assert _finished(engine) == {request.request_id for _, request in workload}
    assert_nothing_left(engine, num_blocks)


def test_tier_policy_admits_the_urgent_tier_first(config_only_model):
    engine = _engine(config_only_model, {"policy": "tier"}, cls=FairSyncScheduler,
                     max_num_seqs=1, num_blocks=4000)
    engine.add([make_request("blocker", 10, 3, arrival_time=0.5)])
    engine.step()
    engine.add([make_request("bronze", 10, 3, arrival_time=1.0, priority=2),
                make_request("gold", 10, 3, arrival_time=2.0, priority=0)])
    admitted = []
    while engine.scheduler.has_unfinished_requests():
        admitted += [new.req_id for new in engine.step().output.scheduled_new_reqs]
    assert admitted == ["gold", "bronze"]


def test_srtf_orders_decodes_and_picks_the_longest_remaining_as_victim(config_only_model):
    engine = _engine(config_only_model, {"policy": "srtf"}, cls=FairSyncScheduler,
                     max_num_seqs=8, num_blocks=4000)
    engine.add([make_request("many-left", 10, 100, arrival_time=1.0),
                make_request("few-left", 10, 5, arrival_time=2.0)])
    engine.step()
    engine.step()
    running = [r.request_id for r in engine.scheduler.running]
    assert running == ["few-left", "many-left"]  # vLLM's victim is running[-1]


@pytest.mark.parametrize("policy", ["estf", "af-lcb"])
def test_estimating_policies_learn_from_completed_requests_only(config_only_model, policy):
    engine = _engine(config_only_model, {"policy": policy, "estf": {"min_samples": 2}},
                     cls=FairSyncScheduler, max_num_seqs=8, num_blocks=4000)
    engine.add([make_request(f"done{i}", 20, 7, arrival_time=1.0 + i) for i in range(3)])
    engine.add([make_request("aborted", 20, 500, arrival_time=5.0)])
    engine.step()
    engine.scheduler.finish_requests("aborted", RequestStatus.FINISHED_ABORTED)
    engine.run_until_idle()
    estimator = engine.scheduler.fairsched_policy.estimator
    assert estimator.overall.n == 3 and estimator.estimate("short").mean == 7


def test_estf_rekeys_the_waiting_queue_when_estimates_change(config_only_model):
    """Once short prompts are known to answer long, a waiting medium prompt overtakes them."""
    engine = _engine(config_only_model, {"policy": "estf", "estf": {"min_samples": 2}},
                     cls=FairSyncScheduler, max_num_seqs=1, num_blocks=4000)
    scheduler = engine.scheduler
    for i in range(2):
        engine.add([make_request(f"s{i}", 20, 40, arrival_time=float(i))])
    engine.run_until_idle()  # short prompts: 40 output tokens
    for i in range(2):
        engine.add([make_request(f"m{i}", 300, 4, arrival_time=10.0 + i)])
    engine.run_until_idle()  # medium prompts: 4 output tokens
    engine.add([make_request("blocker", 20, 3, arrival_time=19.0)])
    engine.step()
    engine.add([make_request("short", 20, 3, arrival_time=20.0),
                make_request("medium", 300, 3, arrival_time=21.0)])
    scheduler.fairsched_policy._last_refresh = float("-inf")  # skip the rate limit
    admitted = []
    while scheduler.has_unfinished_requests():
        admitted += [new.req_id for new in engine.step().output.scheduled_new_reqs]
    assert admitted == ["medium", "short"]
