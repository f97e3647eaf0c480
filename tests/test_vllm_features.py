"""Standard vLLM features keep working under the plugin, on vLLM's real
scheduler with fake model outputs: pause states, blocked waiting requests, the plan's
non-exclusivity, speculative-decoding padding, priority scheduling, prefix caching, the
automatic alpha's arrival order, vLLM's per-request bounds, failure isolation and work
conservation. Each scenario is one that went wrong before the fix it names."""

from __future__ import annotations

import json
import logging
import random
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.interface import PauseState  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.sim.fake_engine import (  # noqa: E402
    OfflineEngine,
    make_request,
)
from fairsched_plugin.adapter.queue import PriorityLevelQueue  # noqa: E402
from fairsched_plugin.adapter.startup import per_engine_path  # noqa: E402
from scheduler_driver import assert_nothing_left, run_workload, scheduler_engine  # noqa: E402

BUDGET = 256
AGING = {"policy": "aging", "aging": {"alpha": 37.5}}


def _engine(model_dir, fairsched: dict, cls=FairSyncScheduler, **kwargs) -> OfflineEngine:
    return scheduler_engine(model_dir, fairsched, cls, budget=BUDGET, **kwargs)


def _grammar_blocked(request_id: str, prompt_tokens: int, arrival_time: float):
    """A structured-output request whose grammar never finishes compiling here (nothing
    compiles it): vLLM keeps it waiting with status WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR."""
    params = SamplingParams(max_tokens=4, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    request = make_request(request_id, prompt_tokens, 4, arrival_time, sampling_params=params)
    assert request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    return request


def test_paused_new_lets_the_running_prefill_drain(config_only_model):
    """Under PAUSED_NEW vLLM admits nothing new, so a queued request that outranks the
    running prefill must not take its budget (it got 0 tokens step after step)."""
    engine = _engine(config_only_model, AGING)
    engine.add([make_request("long", 4000, 4, arrival_time=100.0)])
    engine.step()
    engine.add([make_request("queued", 1000, 4, arrival_time=100.5)])
    engine.scheduler.set_pause_state(PauseState.PAUSED_NEW)
    for _ in range(3):
        assert engine.step().output.num_scheduled_tokens == {"long": BUDGET}
    engine.scheduler.set_pause_state(PauseState.UNPAUSED)
    assert "queued" in engine.step().output.num_scheduled_tokens


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_a_grammar_blocked_request_takes_no_budget(config_only_model, cls):
    """vLLM skips a request whose grammar is compiling; the plan must skip it too, or the
    running prefill it outranks gets nothing until it unblocks."""
    engine = _engine(config_only_model, AGING, cls)
    engine.add([make_request("long", 4000, 4, arrival_time=100.0)])
    engine.step()
    engine.add([_grammar_blocked("grammar", 1000, arrival_time=100.5)])
    for _ in range(4):
        assert engine.step().output.num_scheduled_tokens == {"long": BUDGET}
    engine.scheduler.finish_requests("grammar", RequestStatus.FINISHED_ABORTED)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_the_order_check_remembers_nothing_past_a_blocked_request(config_only_model, cls):
    """With every slot taken vLLM's loop never reaches the queue, so a grammar-blocked
    request ahead of the running prefill stays queued untouched, and its grammar may
    finish at any step. The order check passes it over and finds the prefill ahead of
    the next request; it must not remember that, or the unblocked request would get no
    budget before the prefill."""
    engine = _engine(config_only_model, AGING, cls, max_num_seqs=2)
    engine.add([make_request("decode", 8, 200, arrival_time=100.0),
                make_request("long", 4000, 4, arrival_time=100.0)])
    engine.step()
    engine.step()
    engine.add([_grammar_blocked("grammar", 100, arrival_time=100.5),
                make_request("after", 5000, 4, arrival_time=200.0)])
    scheduler = engine.scheduler
    verdicts = []
    check = scheduler._running_order_is_plan_order
    scheduler._running_order_is_plan_order = (
        lambda *args: verdicts.append(check(*args)) or verdicts[-1])
    for _ in range(3):
        assert "long" in engine.step().output.num_scheduled_tokens
        assert scheduler._ahead is None
    assert verdicts and all(verdicts)
    scheduler.finish_requests("grammar", RequestStatus.FINISHED_ABORTED)


@pytest.mark.parametrize("rule", [{"lprs": {"align": "on"}},
                                  {"apc": {"enabled": True, "min_chunk": 16}}],
                         ids=["alignment", "apc"])
def test_with_a_chunk_rule_a_blocked_request_does_not_starve_the_next(config_only_model, rule):
    """A chunk rule's plan was exclusive: with one grammar-blocked request in the queue,
    the next request got a sliver per step instead of the budget."""
    engine = _engine(config_only_model, {**AGING, **rule})
    engine.add([_grammar_blocked("grammar", 1000, arrival_time=100.0),
                make_request("next", 2000, 4, arrival_time=100.5)])
    for _ in range(3):
        assert engine.step().output.num_scheduled_tokens == {"next": BUDGET}
    engine.scheduler.finish_requests("grammar", RequestStatus.FINISHED_ABORTED)


def test_a_request_the_plan_did_not_reach_takes_the_budget_left(config_only_model):
    """The plan is never exclusive. Without prefix awareness it budgets a mostly cached
    prompt at full length and reaches no further; vLLM then finds the prefix cached,
    and the next waiting request must take the budget that freed up, its chunk ending on
    a KV block as alignment requires."""
    prefix = [(7 * i) % 991 + 2 for i in range(2000)]
    engine = _engine(config_only_model, {"policy": "fcfs", "lprs": {"align": "on"},
                                         "prefix_aware": False},
                     enable_prefix_caching=True)
    engine.add([make_request("first", 0, 1, 100.0, prompt_token_ids=prefix)])
    engine.run_until_idle()
    engine.add([make_request("followup", 0, 4, 200.0, prompt_token_ids=prefix + [5] * 50),
                make_request("fresh", 600, 4, 200.1)])
    scheduled = engine.step().output.num_scheduled_tokens
    assert scheduled["followup"] < 100
    block = engine.scheduler.block_size
    left = BUDGET - scheduled["followup"]
    assert left % block and scheduled["fresh"] == left - left % block > 0


def test_spec_decode_padding_survives_a_chunk_rule(config_only_model):
    """vLLM pads a new one-token request to 1 + k rows under speculative decoding and
    asserts it after the hook; a cap there crashed the engine core."""
    if "pad_spec_decode" not in Scheduler.schedule.__code__.co_varnames:
        pytest.skip("this vLLM does not pad new requests for speculative decoding")
    engine = _engine(config_only_model, {**AGING, "lprs": {"align": "on"}},
                     ngram_speculative_tokens=3)
    engine.add([make_request("decoding", 20, 50, arrival_time=100.0)])
    engine.step()
    engine.step()
    engine.add([make_request("one", 1, 4, arrival_time=101.0)])
    output = engine.step().output
    assert output.num_scheduled_tokens["one"] == 4
    assert output.scheduled_spec_decode_tokens["one"] == [-1, -1, -1]


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_priority_scheduling_orders_first_and_the_policy_within(config_only_model, cls):
    """``--scheduling-policy priority``: vLLM's priority first, the policy's key (here
    shortest remaining prefill, Aging) within a priority. It was ignored."""
    engine = _engine(config_only_model, AGING, cls, scheduling_policy="priority",
                     max_num_seqs=1)
    assert isinstance(engine.scheduler.waiting, PriorityLevelQueue)
    engine.add([
        make_request("low-short", 40, 2, arrival_time=100.0, priority=1),
        make_request("high-long", 600, 2, arrival_time=100.1, priority=0),
        make_request("high-short", 300, 2, arrival_time=100.2, priority=0),
        make_request("low-long", 500, 2, arrival_time=100.3, priority=1),
    ])
    admitted: list[str] = []
    while engine.scheduler.has_unfinished_requests():
        admitted += [new.req_id for new in engine.step().output.scheduled_new_reqs]
    engine.drain()
    assert admitted == ["high-short", "high-long", "low-short", "low-long"]


def test_a_mostly_cached_prompt_ranks_by_its_uncached_part(config_only_model):
    """Prefix caching is on by default: a follow-up turn that resends a cached history
    has little prefill left and must rank (and be budgeted) as such."""
    history = [(13 * i) % 991 + 2 for i in range(2000)]
    engine = _engine(config_only_model, AGING, enable_prefix_caching=True)
    engine.add([make_request("turn-1", 0, 1, 100.0, prompt_token_ids=history)])
    engine.run_until_idle()
    fresh = make_request("fresh", 600, 4, 200.0)
    followup = make_request("turn-2", 0, 4, 200.1, prompt_token_ids=history + [5] * 50)
    engine.add([fresh, followup])
    view = engine.scheduler._view(followup)
    assert view.cached_tokens == 2000 and view.remaining_prefill == 50
    output = engine.step().output
    assert [new.req_id for new in output.scheduled_new_reqs] == ["turn-2", "fresh"]
    assert output.num_scheduled_tokens["turn-2"] == 50


def test_automatic_alpha_is_arrival_order_for_a_sub_millisecond_burst(config_only_model):
    """Before calibration ``alpha: auto`` is arrival order, exactly; the old placeholder
    alpha (1e6) ordered requests 10 microseconds apart by prompt length."""
    engine = _engine(config_only_model, {"policy": "aging", "aging": {"alpha": "auto"}},
                     max_num_seqs=2)
    lengths = [1200, 800, 400, 200, 100, 50]
    engine.add([make_request(f"r{i}", n, 2, arrival_time=100.0 + i * 1e-5)
                for i, n in enumerate(lengths)])
    admitted: list[str] = []
    while engine.scheduler.has_unfinished_requests():
        admitted += [new.req_id for new in engine.step().output.scheduled_new_reqs]
    engine.drain()
    assert engine.scheduler.fairsched_policy.alpha is None
    assert admitted == [f"r{i}" for i in range(len(lengths))]


def test_the_plan_follows_the_long_prefill_threshold(config_only_model):
    """vLLM cuts every request to ``long_prefill_token_threshold``; a plan that did not
    know gave the waiting request the whole budget, held the running prefill at 0, and
    the step ran a quarter full."""
    engine = _engine(config_only_model, AGING, long_prefill_token_threshold=64)
    engine.add([make_request("long", 2000, 4, arrival_time=100.0)])
    # vLLM 0.31+ lifts the threshold for a lone request; earlier releases always cut.
    alone = BUDGET if engine.scheduler.fairsched_surface.threshold_spares_lone_request else 64
    assert engine.step().output.num_scheduled_tokens == {"long": alone}
    engine.add([make_request("short", 1000, 4, arrival_time=100.5)])
    assert engine.step().output.num_scheduled_tokens == {"short": 64, "long": 64}


def test_in_flight_decodes_are_not_counted(config_only_model):
    """Under pipeline parallelism a decode whose previous step is still in the pipeline
    is skipped by vLLM; counting it inflated the chunk rule's decode load."""
    engine = _engine(config_only_model, {**AGING, "apc": {"enabled": True}})
    scheduler = engine.scheduler
    engine.add([make_request(f"d{i}", 20, 50, arrival_time=100.0 + i) for i in range(3)])
    engine.step()
    engine.step()
    decodes = [r for r in scheduler.running if not r.is_prefill_chunk]
    assert len(decodes) == 3
    assert len(scheduler._decode_tokens(decodes)) == 3
    decodes[0].next_decode_eligible_step = scheduler.current_step + 2
    assert [ctx for ctx, _n in scheduler._decode_tokens(decodes)] == [
        r.num_computed_tokens for r in decodes[1:]]


def test_the_last_prompt_token_is_a_prefill_in_the_trace(config_only_model, tmp_path):
    """A prefill with exactly one token left was counted as a decode."""
    trace = tmp_path / "trace.jsonl"
    engine = _engine(config_only_model, {"policy": "fcfs", "trace_path": str(trace)})
    engine.add([make_request("r", BUDGET + 1, 2, arrival_time=100.0)])
    engine.run_until_idle()
    engine.scheduler.shutdown()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert records[1]["prefill_chunks"] == [1] and records[1]["prefill_done"] == ["r"]
    assert records[1]["decode_tokens"] == 0


@pytest.mark.degrades
def test_a_failure_while_hiding_restores_every_request(config_only_model, caplog):
    """Ranked service hides requests from vLLM's loop; if anything fails after that,
    they come back, the step runs as stock vLLM would, and the error is logged once."""
    engine = _engine(config_only_model, {**AGING, "service": "ranked", "max_batch_size": 2})
    scheduler = engine.scheduler
    engine.add([make_request(f"d{i}", 20, 30, arrival_time=100.0 + i) for i in range(2)])
    for _ in range(3):
        engine.step()
    # Two better-ranked arrivals: ranked service would hide d0 and d1 for them.
    engine.add([make_request(f"d{i}", 20, 30, arrival_time=50.0 + i) for i in range(2, 4)])
    pool = scheduler.kv_cache_manager.block_pool
    real = pool.get_num_free_blocks

    def fails_in_the_plugin() -> int:
        if sys._getframe(1).f_code.co_name == "_hide_unranked":  # after running was trimmed
            raise RuntimeError("memory read failed")
        return real()

    pool.get_num_free_blocks = fails_in_the_plugin
    with caplog.at_level(logging.ERROR, logger="vllm.fairsched"):
        first = engine.step().output.num_scheduled_tokens
        engine.step()
    assert sorted(first) == [f"d{i}" for i in range(4)]  # nothing hidden, as stock vLLM
    assert sorted(r.request_id for r in scheduler.running) == [f"d{i}" for i in range(4)]
    assert scheduler._failures["planning"] == 2
    assert sum("planning failed" in r.getMessage() for r in caplog.records) == 1
    pool.get_num_free_blocks = real
    engine.run_until_idle()


@pytest.mark.degrades
def test_a_failing_trace_does_not_stop_the_engine(config_only_model, tmp_path):
    trace = tmp_path / "trace.jsonl"
    engine = _engine(config_only_model, {**AGING, "trace_path": str(trace)})
    engine.add([make_request(f"r{i}", 300, 5, arrival_time=100.0 + i) for i in range(3)])
    engine.step()
    engine.scheduler._steps._file.close()  # every later write raises ValueError
    engine.run_until_idle()
    assert not engine.scheduler.requests
    assert engine.scheduler._failures["the step trace and its listeners"] > 1


def test_files_per_engine_core_carry_the_data_parallel_rank():
    one = SimpleNamespace(data_parallel_size=1, data_parallel_rank=0)
    two = SimpleNamespace(data_parallel_size=2, data_parallel_rank=1)
    assert per_engine_path("runs/trace.jsonl", one) == "runs/trace.jsonl"
    assert per_engine_path("runs/trace.jsonl", two) == "runs/trace.dp1.jsonl"
    assert per_engine_path("runs.d/profile", two) == "runs.d/profile.dp1"
    # A model without experts: vLLM makes every rank an independent size-1 group of
    # rank 0 and keeps the rank in data_parallel_index.
    independent = SimpleNamespace(data_parallel_size=1, data_parallel_rank=0,
                                  data_parallel_index=1)
    assert per_engine_path("runs/trace.jsonl", independent) == "runs/trace.dp1.jsonl"


POLICIES = [AGING, {"policy": "guarded-srpf"}, {"policy": "spf"}, {"policy": "srtf"},
            {"policy": "estf"}, {"policy": "af-lcb"}, {"policy": "fcfs"},
            {**AGING, "decodes_first": True}, {"policy": "aging"},
            {"policy": "guarded-aging"}, {"policy": "preflow"}, {"policy": "hrrn"}]


@pytest.mark.parametrize("seed", range(len(POLICIES) + 2))
def test_work_conservation(config_only_model, seed):
    """Whenever a step leaves budget unused, no admissible request could have used it:
    every running request got all of its work and the waiting queues are empty or the
    running slots full. (Without a chunk rule, whose chunk choice is deliberate, and
    with KV room to spare.)"""
    rng = random.Random(seed)
    fairsched = POLICIES[seed % len(POLICIES)]
    cls = (FairScheduler, FairSyncScheduler)[seed % 2]
    if seed >= len(POLICIES):  # the same check holds for stock vLLM
        cls = (AsyncScheduler, Scheduler)[seed % 2]
    max_num_seqs = rng.choice([2, 4, 8])
    engine = _engine(config_only_model, fairsched, cls, max_num_seqs=max_num_seqs,
                     enable_prefix_caching=bool(seed % 3 == 0))
    scheduler = engine.scheduler
    shared = [(17 * i) % 991 + 2 for i in range(600)]
    pending = []
    for i in range(40):
        arrival_step = rng.randrange(0, 120)
        if rng.random() < 0.25:
            prompt = shared[:rng.randrange(64, 600)] + [i + 3] * rng.randrange(1, 40)
            request = make_request(f"r{i}", 0, rng.randrange(1, 30), 100.0 + arrival_step,
                                   prompt_token_ids=prompt)
        else:
            request = make_request(f"r{i}", rng.randrange(1, 900), rng.randrange(1, 30),
                                   100.0 + arrival_step)
        pending.append((arrival_step, request))
    pending.sort(key=lambda item: (item[0], item[1].request_id))
    step = 0
    while pending or scheduler.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            engine.add([pending.pop(0)[1]])
        output = engine.schedule().output  # checked before any output is applied
        if output.total_num_scheduled_tokens < BUDGET:
            for request in scheduler.running:
                left = (request.num_tokens_with_spec + request.num_output_placeholders
                        - request.num_computed_tokens)
                assert not request.is_prefill_chunk or left <= 0, (
                    f"step {step}: {request.request_id} has prefill left and budget is unused")
            held = getattr(scheduler, "kv_holding_waiting", None)  # skipped_waiting before 0.31
            if held is None:
                held = scheduler.skipped_waiting
            waiting = len(scheduler.waiting) + len(held)
            assert waiting == 0 or len(scheduler.running) >= max_num_seqs, (
                f"step {step}: {waiting} waiting, {len(scheduler.running)} running")
        while len(engine._queue) >= engine.in_flight:
            engine.complete_oldest()
        step += 1
        assert step < 5000
    engine.drain()


def test_a_preempted_request_ranks_by_what_the_cache_kept(config_only_model):
    """A preempted request's blocks go back to the prefix cache; on re-entering the
    waiting queue it is looked up again and ranks by the part it must recompute (it was
    demoted to its full length)."""
    engine = _engine(config_only_model, AGING, enable_prefix_caching=True, num_blocks=80)
    scheduler = engine.scheduler
    engine.add([make_request("a", 600, 200, arrival_time=100.0),
                make_request("b", 600, 200, arrival_time=100.1)])
    for _ in range(400):
        engine.step()
        b = scheduler.requests.get("b")
        if b is not None and b.status == RequestStatus.PREEMPTED:
            break
    else:
        pytest.fail("b was never preempted")
    view = scheduler._view(b)
    assert view.cached_tokens >= 512
    assert view.remaining_prefill <= b.num_tokens - 512
    engine.run_until_idle()


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_an_extended_streaming_session_is_queued_as_what_it_became(config_only_model, cls):
    """A streaming-input session waits for its next chunk in a waiting queue, and vLLM
    extends its prompt in place when the chunk comes. Queued under its last turn's key
    (one token left), work and deadline (overdue at once), a long chunk would go before
    every shorter request."""
    engine = _engine(config_only_model,
                     {"policy": "guarded-srpf", "guarded_srpf": {"tail_window": 0, "overtake_running": True}}, cls)
    scheduler = engine.scheduler
    if not scheduler.fairsched_surface.has_streaming_sessions:
        pytest.skip("this vLLM has no streaming-input sessions")
    session = make_request("session", 40, 3, 100.0)
    session.resumable = True
    engine.add([session])
    engine.run_until_idle()
    assert session.status == RequestStatus.WAITING_FOR_STREAMING_REQ
    chunk = make_request("session", 600, 3, 200.0)
    chunk.resumable = True
    short = make_request("short", 50, 3, 200.1)
    engine.add([chunk, short])
    assert session.status == RequestStatus.WAITING and session.num_prompt_tokens > 600
    queue = scheduler.kv_holding_waiting
    entry, timed, work, snapshot, _position = queue._entries[session]
    view = scheduler._view(session)
    assert snapshot == view
    assert tuple(entry[:-2]) == scheduler.fairsched_policy.key(view)
    assert work == view.remaining_prefill > 500
    assert timed[0] == scheduler._deadlines["session"] > scheduler.fairsched_policy.overdue_cutoff(0)
    assert scheduler.waiting.work + queue.work == view.remaining_prefill + 50
    engine.run_until_idle()
    assert "short" not in scheduler.requests
    assert session.status == RequestStatus.WAITING_FOR_STREAMING_REQ  # its next turn
    assert queue.holds(session) and scheduler.waiting.work == 0
    assert queue.work == scheduler._view(session).remaining_prefill  # its last token again


def test_the_lora_limit_skips_a_request_one_adapter_over_max_loras():
    """vLLM's ``max_loras`` rule as the plan reads it: adapters of running requests count,
    an admission takes a slot, and without a LoRA config every request is admitted by a
    shared bookkeeping that no admission changes. Plain stand-ins for the scheduler and
    requests: the rule reads only these attributes."""
    from vllm.lora.request import LoRARequest

    from fairsched_plugin.adapter.admission import LoraSlots

    def asking(lora_id: int | None) -> SimpleNamespace:
        lora = LoRARequest(f"a{lora_id}", lora_id, "/adapter") if lora_id else None
        return SimpleNamespace(lora_request=lora)

    limited = SimpleNamespace(lora_config=SimpleNamespace(max_loras=2),
                              running=[asking(1), asking(None)])
    slots = LoraSlots.of(limited)
    assert slots.admits(asking(1)) and slots.admits(asking(None))
    assert slots.admits(asking(2))
    assert not slots.admits(asking(3))
    assert slots.in_use == {1, 2}
    assert LoraSlots.of(limited).in_use == {1}  # a new step starts from the running ones

    unlimited = LoraSlots.of(SimpleNamespace(lora_config=None, running=[asking(1)]))
    assert all(unlimited.admits(asking(i)) for i in (1, 2, 3, 4))
    assert unlimited.in_use == set()
    assert LoraSlots.of(SimpleNamespace(lora_config=None, running=[])) is unlimited


needs_cache_aware = pytest.mark.skipif(
    not hasattr(Scheduler, "_reorder_waiting_by_cached_prefix"),
    reason="cache-aware admission (cache_aware_admission_window) is vLLM 0.34+")


def _cache_aware_engine(model_dir, fairsched: dict, window: int, **kwargs) -> OfflineEngine:
    """Prefix caching on and ``cache_aware_admission_window`` = ``window``, threshold 0:
    what vLLM's ``__init__`` derives from those settings under its FCFS policy."""
    engine = _engine(model_dir, fairsched, enable_prefix_caching=True, **kwargs)
    engine.scheduler.cache_aware_window = window
    engine.scheduler.cache_aware_threshold = 0.0
    return engine


@needs_cache_aware
@pytest.mark.parametrize("window", [8, 0])
def test_cache_aware_admission_ranks_a_prefix_cached_while_waiting(config_only_model,
                                                                   window):
    """One running slot. "sibling" shares 160 tokens with "warm" and queues before warm
    has computed them: at its whole 260 tokens it ranks after "fresh" (200). With the
    window on, once warm's prefix is cached the sibling is looked up again and ranks at
    its 100 uncached tokens, ahead of fresh; with the window off the entry lookup stands."""
    prefix = [(19 * i) % 991 + 2 for i in range(160)]
    engine = _cache_aware_engine(config_only_model, AGING, window, max_num_seqs=1)
    engine.add([make_request("warm", 0, 2, 100.0, prompt_token_ids=prefix + [3] * 16),
                make_request("fresh", 200, 2, 100.1),
                make_request("sibling", 0, 2, 100.2, prompt_token_ids=prefix + [4] * 100)])
    admitted = []
    while engine.scheduler.has_unfinished_requests():
        admitted += [new.req_id for new in engine.step().output.scheduled_new_reqs]
    engine.drain()
    assert admitted == (["warm", "sibling", "fresh"] if window else
                        ["warm", "fresh", "sibling"])
    assert_nothing_left(engine, 10_000)


@needs_cache_aware
@pytest.mark.parametrize("policy", ["aging", "guarded-srpf", "guarded-aging", "spf", "hrrn",
                                    "fcfs"])
@pytest.mark.parametrize("own_reorder", [False, True])
def test_cache_aware_admission_keeps_every_queue_whole(config_only_model, policy,
                                                        own_reorder):
    """Shared-prefix traffic with the window on: every request ends and the queues and
    KV cache drain, under the plugin's re-ranking and also under vLLM's own reorder run
    on the policy heap (its ``remove_requests`` of the window, then ``prepend_request``
    of each), as a subclass calling vLLM's method would."""
    rng = random.Random(len(policy))
    engine = _cache_aware_engine(config_only_model, {"policy": policy}, 6, max_num_seqs=3)
    if own_reorder:
        engine.scheduler._reorder_waiting_by_cached_prefix = (
            lambda: Scheduler._reorder_waiting_by_cached_prefix(engine.scheduler))
    shared = [(23 * i) % 991 + 2 for i in range(400)]
    workload = []
    for i in range(30):
        prompt = (shared[:rng.randrange(32, 400)] if rng.random() < 0.6 else []) + [
            i + 3] * rng.randrange(1, 120)
        workload.append((rng.randrange(0, 40),
                         make_request(f"r{i}", 0, rng.randrange(1, 12), 100.0 + i,
                                      prompt_token_ids=prompt)))
    workload.sort(key=lambda item: item[0])
    run_workload(engine, workload, budget=BUDGET)
    assert_nothing_left(engine, 10_000)
