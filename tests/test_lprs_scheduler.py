"""LPRS, APC and alignment inside the real vLLM scheduler (fake model outputs), with a
hand-made linear ONNX latency model served by a real ONNX Runtime session."""

from __future__ import annotations

import json
import logging
import math
import random

import pytest

pytest.importorskip("vllm")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from vllm.v1.request import RequestStatus  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.sim.fake_engine import (  # noqa: E402
    OfflineEngine,
    make_request,
    make_scheduler,
)
from fairsched_plugin.predictor.features import FEATURE_NAMES  # noqa: E402
from fairsched_plugin.predictor.roofline import RooflineLatencyModel  # noqa: E402
from fairsched_plugin.predictor.runtime import PredictorError  # noqa: E402
from linear_onnx import write_linear_model  # noqa: E402
from scheduler_driver import run_workload, scheduler_engine  # noqa: E402

BUDGET = 256


@pytest.fixture
def model(tmp_path):
    """10 ms + 0.25 ms per scheduled token: 160 tokens hit a 50 ms target."""
    return write_linear_model(tmp_path / "linear.onnx", base_ms=10.0, per_token_ms=0.25)


def _engine(model_dir, config, cls=FairSyncScheduler, **kwargs) -> OfflineEngine:
    kwargs.setdefault("num_blocks", 4000)
    return scheduler_engine(model_dir, config, cls, budget=BUDGET, **kwargs)


def _lprs(model, **extra):
    """LPRS on the given model. The fake steps take no time, so the online correction and
    the guard against a mismatched predictor (tested on their own below) are off: these
    tests work out the paper's choices by hand."""
    return {"policy": "fcfs", "predictor": {"path": str(model)},
            "lprs": {"enabled": True, "target_ms": 50.0, "granularity": 32, "correction": 0.0,
                     "guard_window": 0},
            **extra}


def test_lprs_chooses_the_chunk_whose_predicted_time_meets_the_target(config_only_model, model):
    engine = _engine(config_only_model, _lprs(model))
    engine.add([make_request("long", 2000, 4, arrival_time=1.0)])
    # 10 + 0.25 * 160 = 50 ms; the token budget rule would take all 256.
    assert engine.step().output.num_scheduled_tokens == {"long": 160}


def test_lprs_counts_decodes_in_the_batch_it_predicts(config_only_model, model):
    engine = _engine(config_only_model, _lprs(model), max_num_seqs=64)
    engine.add([make_request(f"d{i}", 10, 100, arrival_time=float(i)) for i in range(40)])
    scheduler = engine.scheduler
    while scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running
    ):
        engine.step()
    engine.add([make_request("long", 2000, 4, arrival_time=100.0)])
    scheduled = engine.step().output.num_scheduled_tokens
    # With 40 decodes the batch takes 10 + 0.25 * (40 + c) ms: c = 96 gives 44 ms (6 under,
    # score 6), c = 128 gives 52 ms (2 over, score 4 x 2 = 8), so 96.
    assert scheduled["long"] == 96
    assert sum(scheduled.values()) == 136


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
@pytest.mark.parametrize("policy", ["fcfs", "aging", "srtf", "af-lcb"])
def test_the_budget_always_holds_and_everything_finishes(config_only_model, model, cls, policy):
    config = _lprs(model, policy=policy, apc={"enabled": True, "max_active_prefills": 2},
                   lprs={"enabled": True, "target_ms": 40.0, "granularity": 16, "align": "on",
                         "guard_window": 0})
    if policy == "aging":
        config["aging"] = {"alpha": 37.5}
    engine = _engine(config_only_model, config, cls=cls, max_num_seqs=8)
    rng = random.Random(3)
    pending = sorted(
        ((rng.randint(0, 60), make_request(f"r{i}", rng.choice([20, 300, 1500]),
                                           rng.randint(1, 30), arrival_time=1000.0 + i))
         for i in range(40)),
        key=lambda item: item[0],
    )
    ids = {request.request_id for _, request in pending}
    run_workload(engine, pending, budget=BUDGET)
    finished = {rid for record in engine.steps for rid, tokens in record.sampled.items() if tokens}
    assert finished == ids
    rule = engine.scheduler._chunk_rule
    assert not rule.apc.deferred and not rule._cut_to  # nothing left behind per request


def test_nonsense_predictions_fall_back_to_the_budget_rule_and_log_once(
    config_only_model, tmp_path, caplog
):
    negative = write_linear_model(tmp_path / "neg.onnx", base_ms=10.0, per_token_ms=-1.0)
    engine = _engine(config_only_model, _lprs(negative))
    engine.add([make_request("a", 2000, 4, arrival_time=1.0)])
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        for _ in range(3):
            assert engine.step().output.num_scheduled_tokens == {"a": BUDGET}
    assert engine.scheduler._chunk_rule.fallbacks == 3
    warnings = [r for r in caplog.records if "fell back" in r.getMessage()]
    assert len(warnings) == 1


def test_warm_start_gives_a_minimum_chunk_when_the_target_is_already_spent(
    config_only_model, tmp_path
):
    """Every candidate overflows (100 ms fixed cost > 50 ms target), so LPRS proposes one
    token; with no prefill active, APC warm-starts one prefill at L_min and holds the rest."""
    slow = write_linear_model(tmp_path / "slow.onnx", base_ms=100.0, per_token_ms=0.25)
    engine = _engine(config_only_model, _lprs(slow, apc={"enabled": True, "min_chunk": 24}))
    engine.add([make_request("a", 500, 4, arrival_time=1.0),
                make_request("b", 500, 4, arrival_time=2.0)])
    record = engine.step()
    assert record.output.num_scheduled_tokens == {"a": 24}
    counts = engine.scheduler._chunk_rule.apc.counts
    assert counts["warm_start"] == 1 and counts["blocked_by_min_chunk"] == 1


def test_apc_caps_active_prefills(config_only_model, model):
    """The cap counts the prefills a step leaves unfinished; chunks that finish their
    prompt get through beside them."""
    engine = _engine(config_only_model, {
        "policy": "fcfs", "apc": {"enabled": True, "max_active_prefills": 2, "min_chunk": 16}},
        long_prefill_token_threshold=40)
    engine.add([make_request(f"r{i}", 400, 4, arrival_time=float(i)) for i in range(2)]
               + [make_request(f"s{i}", 30, 4, arrival_time=2.0 + i) for i in range(3)]
               + [make_request(f"r{i}", 400, 4, arrival_time=3.0 + i) for i in range(2, 5)])
    assert engine.step().output.num_scheduled_tokens == {
        "r0": 40, "r1": 40, "s0": 30, "s1": 30, "s2": 30}


def _long_prompt_under_short_stream(model_dir, max_deferred_steps: int,
                                    steps: int) -> tuple[int, int]:
    """Prefill tokens a long prompt gets in ``steps`` steps while, under SPF with room for
    one unfinished prefill and chunks of at most 100 tokens, a new 150-token request
    arrives every step, outranks it and takes the slot with its first chunk. Also returns
    what its first step, alone, gave it."""
    engine = _engine(model_dir, {
        "policy": "spf",
        "apc": {"enabled": True, "max_active_prefills": 1, "min_chunk": 16,
                "max_deferred_steps": max_deferred_steps},
    }, max_num_seqs=64, long_prefill_token_threshold=100)
    engine.add([make_request("long", 1200, 500, arrival_time=0.0)])
    # Alone at first: it becomes a running partial prefill.
    alone = engine.step().output.num_scheduled_tokens["long"]
    for step in range(steps):
        engine.add([make_request(f"s{step}", 150, 2, arrival_time=1.0 + step)])
        engine.step()
    return min(engine.scheduler.requests["long"].num_computed_tokens, 1200), alone


def test_no_starvation_under_a_sustained_stream_of_short_requests(config_only_model):
    # Without the deferral bound the activity cap keeps the long prompt where it was...
    stuck, alone = _long_prompt_under_short_stream(config_only_model, 10**6, steps=60)
    assert stuck == alone
    # ...with it, the long prompt is forced forward every few steps and finishes.
    assert _long_prompt_under_short_stream(config_only_model, 4, steps=60)[0] == 1200


def test_alignment_ends_chunks_on_block_boundaries_except_the_last(config_only_model):
    engine = _engine(config_only_model, {"policy": "fcfs", "lprs": {"align": "on"}},
                     max_num_batched_tokens=100)
    engine.add([make_request("a", 250, 2, arrival_time=1.0)])
    chunks = []
    while engine.scheduler.requests["a"].num_computed_tokens < 250:
        chunks.append(engine.step().output.num_scheduled_tokens["a"])
    ends = [sum(chunks[: i + 1]) for i in range(len(chunks))]
    assert all(end % 16 == 0 for end in ends[:-1]) and ends[-1] == 250
    assert chunks[0] == 96


def test_trace_has_prediction_candidates_and_apc_counters(config_only_model, model, tmp_path):
    trace = tmp_path / "trace.jsonl"
    engine = _engine(config_only_model, _lprs(model, apc={"enabled": True},
                                              trace_path=str(trace)))
    engine.add([make_request("a", 600, 3, arrival_time=1.0)])
    engine.run_until_idle()
    engine.scheduler.shutdown()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    first = records[0]
    assert first["prefill_chunks"] == [160]
    assert first["lprs_predicted_ms"] == pytest.approx(50.0)
    assert first["lprs_candidates"] == 9 and first["lprs_fallback"] is False
    assert first["apc"]["accepted"] == 1 and first["apc_cap"] == 8


def test_a_missing_or_mismatched_model_stops_start_up(config_only_model, tmp_path):
    with pytest.raises(PredictorError, match="no such file"):
        _engine(config_only_model, _lprs(tmp_path / "absent.onnx"))
    other = write_linear_model(tmp_path / "nvml.onnx", 10.0, 0.25, memory_provider="nvml")
    with pytest.raises(PredictorError, match="memory provider"):
        _engine(config_only_model, _lprs(other))
    engine = _engine(config_only_model,
                     {**_lprs(other), "predictor": {"path": str(other),
                                                    "allow_memory_mismatch": True}})
    assert engine.scheduler._chunk_rule.predictor is not None


def test_lprs_without_a_model_file_plans_like_the_token_budget_until_its_model_is_ready(
        config_only_model):
    """No predictor.path: the built-in model. Here (the CPU, no preset) it has seen no
    step, so LPRS gives every candidate its bound, as the token budget does, even with a
    target that would cut every chunk."""
    lprs = {"policy": "fcfs", "lprs": {"enabled": True, "target_ms": 0.001}}
    engine, plain = _engine(config_only_model, lprs), _engine(config_only_model,
                                                             {"policy": "fcfs"})
    rule = engine.scheduler._chunk_rule
    assert isinstance(rule.predictor, RooflineLatencyModel)
    assert not rule.predictor.ready and rule.guard.fallen_back
    for e in (engine, plain):
        e.add([make_request(f"r{i}", 300 + 40 * i, 3, arrival_time=1.0 + i) for i in range(6)])
    for _ in range(8):
        assert engine.step().output.num_scheduled_tokens == plain.step().output.num_scheduled_tokens


def test_lprs_with_a_preset_device_plans_from_the_first_step(config_only_model):
    engine = _engine(config_only_model, {
        "policy": "fcfs", "predictor": {"model": "qwen3-8b", "device": "h100"},
        "lprs": {"enabled": True, "target_ms": 0.001, "guard_window": 0}})
    assert engine.scheduler._chunk_rule.predictor.ready
    engine.add([make_request("long", 2000, 2, arrival_time=1.0)])
    assert engine.step().output.num_scheduled_tokens["long"] < BUDGET


def test_aborted_deferred_requests_leave_no_apc_state(config_only_model):
    engine = _engine(config_only_model, {
        "policy": "fcfs", "apc": {"enabled": True, "max_active_prefills": 1}})
    engine.add([make_request("a", 2000, 2, arrival_time=1.0),
                make_request("b", 2000, 2, arrival_time=2.0)])
    engine.step()
    engine.step()
    assert "b" not in engine.scheduler._chunk_rule.apc.deferred  # waiting: never considered
    engine.scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    engine.drain()
    assert not engine.scheduler._chunk_rule.apc.deferred


@pytest.mark.parametrize("correction", [0.0, 0.5])
def test_online_correction_follows_a_model_that_under_predicts(config_only_model, model,
                                                               correction):
    """The model says 160 tokens take 50 ms; every fake step really takes 70 ms. With the
    correction the bias climbs towards the 20 ms gap and LPRS takes smaller chunks; with
    correction 0 (the paper's predictor) it keeps taking 160."""
    scheduler = make_scheduler(
        FairSyncScheduler, config_only_model, max_num_batched_tokens=BUDGET, num_blocks=4000,
        async_scheduling=False,
        additional_config={"fairsched": _lprs(model, lprs={
            "enabled": True, "target_ms": 50.0, "granularity": 32, "correction": correction})},
    )
    engine = OfflineEngine(scheduler, model_time_s=0.07)
    engine.add([make_request("long", 4000, 2, arrival_time=1.0)])
    chunks = [engine.step().output.num_scheduled_tokens["long"] for _ in range(8)]
    rule = scheduler._chunk_rule
    if correction == 0:
        assert chunks == [160] * 8 and rule.bias_ms == 0.0
    else:
        assert chunks[0] == 160
        assert 10.0 < rule.bias_ms <= 50.0
        assert chunks[-1] < 160


# ------------------------------------------------------------- a predictor that does not fit


def test_memory_outside_the_training_range_is_clamped_into_it(config_only_model, tmp_path,
                                                              caplog):
    """The model was trained where 1,000 MiB of KV cache were always in use (it adds
    0.01 ms per MiB: 10 ms); this engine's fake cache uses almost none. Clamped, the model
    reads 1,000 MiB: 20 + 0.25 * c ms, so c = 96 (44 ms, 6 under) beats 128 (52 ms, 2 over,
    score 8); unclamped it would read 0 MiB and take 160."""
    wide = {name: [0.0, 1e9] for name in FEATURE_NAMES}
    ranges = {**wide, "bias": [1.0, 1.0], "gpu_mem_used_mb": [1000.0, 1000.0]}
    model = write_linear_model(tmp_path / "ranged.onnx", 10.0, 0.25, per_used_mib_ms=0.01,
                               feature_ranges=ranges)
    trace = tmp_path / "trace.jsonl"
    engine = _engine(config_only_model, _lprs(model, trace_path=str(trace)))
    engine.add([make_request("long", 2000, 4, arrival_time=1.0)])
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        chunks = [engine.step().output.num_scheduled_tokens["long"] for _ in range(3)]
    engine.drain()
    engine.scheduler.shutdown()
    assert chunks == [96, 96, 96]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["lprs_clamped"] for r in records] == [["gpu_mem_used_mb"]] * 3
    assert records[0]["lprs_model_ms"] == pytest.approx(20.0 + 0.25 * 96)
    warnings = [r.getMessage() for r in caplog.records if "training range" in r.getMessage()]
    assert len(warnings) == 1 and "gpu_mem_used_mb" in warnings[0]


def _mismatch_config(model, window: int, correction: float = 0.0) -> dict:
    return _lprs(model, lprs={"enabled": True, "target_ms": 21.0, "granularity": 32,
                              "correction": correction, "guard_window": window})


def _prefill_steps(engine: OfflineEngine, request_id: str, prompt: int, limit: int) -> list[int]:
    chunks = []
    while engine.scheduler.requests[request_id].num_computed_tokens < prompt:
        chunks.append(engine.step().output.num_scheduled_tokens.get(request_id, 0))
        assert len(chunks) < limit, "prefill did not finish"
    return chunks


@pytest.mark.parametrize("correction", [0.0, 0.1])
def test_a_predictor_far_too_high_falls_back_to_the_token_budget_within_the_window(
    config_only_model, tmp_path, caplog, correction
):
    """The model says a step takes 100 ms plus 0.05 ms a token, and every step really takes
    about 1 ms: every chunk overflows the 21 ms target, so LPRS would schedule one token per
    step (even with the online bias at its 21 ms limit). The guard sees the predictions
    are far off and hands the step back to the token budget after its window."""
    model = write_linear_model(tmp_path / "high.onnx", base_ms=100.0, per_token_ms=0.05)
    window, prompt = 4, 2000
    budget_rule = OfflineEngine(make_scheduler(
        FairSyncScheduler, config_only_model, max_num_batched_tokens=BUDGET, num_blocks=4000,
        async_scheduling=False, additional_config={"fairsched": {"policy": "fcfs"}}))
    budget_rule.add([make_request("long", prompt, 2, arrival_time=1.0)])
    budget_steps = len(_prefill_steps(budget_rule, "long", prompt, 100))

    strangled = _engine(config_only_model, _mismatch_config(model, 0, correction))
    strangled.model_time_s = 0.001
    strangled.add([make_request("long", prompt, 2, arrival_time=1.0)])
    assert [strangled.step().output.num_scheduled_tokens["long"] for _ in range(12)] == [1] * 12

    engine = _engine(config_only_model, _mismatch_config(model, window, correction))
    engine.model_time_s = 0.001
    engine.add([make_request("long", prompt, 2, arrival_time=1.0)])
    with caplog.at_level(logging.INFO, logger="vllm.fairsched"):
        chunks = _prefill_steps(engine, "long", prompt, 100)
    assert chunks[:window] == [1] * window  # LPRS's choice until the window is full
    assert set(chunks[window + 1:-1]) == {BUDGET}  # then the token budget's
    assert len(chunks) <= budget_steps + window + 1
    falls = [r for r in caplog.records if "falls back to the token-budget rule" in r.getMessage()]
    assert len(falls) == 1 and falls[0].levelno == logging.WARNING
    assert "median relative error of the last 4 predictions" in falls[0].getMessage()
    assert engine.scheduler._chunk_rule.guard.fallen_back


def test_lprs_resumes_when_the_predictions_agree_again(config_only_model, tmp_path, caplog):
    """20 ms + 0.05 ms a token against a 21 ms target: LPRS takes one token a step. Steps
    of 1 ms make the guard fall back; once steps take what the model predicts for the
    token budget's 256-token batches (32.8 ms), it resumes, and LPRS chooses again."""
    model = write_linear_model(tmp_path / "model.onnx", base_ms=20.0, per_token_ms=0.05)
    window = 4
    engine = _engine(config_only_model, _mismatch_config(model, window))
    engine.add([make_request("long", 8000, 2, arrival_time=1.0)])
    guard = engine.scheduler._chunk_rule.guard
    engine.model_time_s = 0.001
    with caplog.at_level(logging.INFO, logger="vllm.fairsched"):
        chunks = [engine.step().output.num_scheduled_tokens["long"] for _ in range(window + 3)]
        assert guard.fallen_back and chunks[-1] == BUDGET
        engine.model_time_s = 0.0328
        for _ in range(2 * window + 2):
            chunks.append(engine.step().output.num_scheduled_tokens["long"])
            if not guard.fallen_back:
                break
        assert not guard.fallen_back
        assert engine.step().output.num_scheduled_tokens["long"] == 1  # LPRS's choice again
    messages = [(r.levelno, r.getMessage()) for r in caplog.records
                if "LPRS falls back" in r.getMessage() or "LPRS resumes" in r.getMessage()]
    assert [level for level, _ in messages] == [logging.WARNING, logging.INFO]
    assert "at most lprs.guard_recover_error 0.5" in messages[1][1]


def test_lprs_and_apc_are_on_only_with_a_fitted_model_and_never_under_fcfs(
        config_only_model, model):
    from fairsched_plugin.sim.fake_engine import make_scheduler

    default = make_scheduler(FairSyncScheduler, config_only_model, async_scheduling=False)
    assert default._chunk_rule is None  # the built-in model is not fitted to the engine
    fitted = make_scheduler(FairSyncScheduler, config_only_model, async_scheduling=False,
                            additional_config={"fairsched": {"predictor": {"path": str(model)}}})
    assert fitted._chunk_rule.params is not None and fitted._chunk_rule.apc is not None
    built_in = make_scheduler(
        FairSyncScheduler, config_only_model, async_scheduling=False,
        additional_config={"fairsched": {"lprs": {"enabled": True}, "apc": {"enabled": True}}})
    rule = built_in._chunk_rule
    assert isinstance(rule.predictor, RooflineLatencyModel) and rule.apc is not None
    # The automatic target: no preset for this CPU, so none until the model has seen steps.
    assert rule.auto_target and not rule.params.target_ms > 0
    control = make_scheduler(FairSyncScheduler, config_only_model, async_scheduling=False,
                             additional_config={"fairsched": {"policy": "fcfs",
                                                              "predictor": {"path": str(model)}}})
    assert control._chunk_rule is None


def test_the_automatic_target_is_predicted_once_the_built_in_model_has_learned(
        config_only_model):
    """No preset for this CPU: the target is NaN at first, and the online correction of
    those first steps must not turn the bias into NaN (it would keep every prediction,
    the target and so LPRS off for good)."""
    engine = _engine(config_only_model, {"lprs": {"enabled": True},
                                         "apc": {"enabled": True}})  # the built-in model
    rule = engine.scheduler._chunk_rule
    engine.add([make_request(f"r{i}", 600, 20, arrival_time=1.0 + i) for i in range(3)])
    for step in range(100):
        engine.model_time_s = 0.004 + 0.0002 * (step % 7)  # a little variation to fit
        if not engine.scheduler.has_unfinished_requests():
            break
        engine.step()
    assert math.isfinite(rule.bias_ms)
    assert rule.params.target_ms > 0


@pytest.mark.parametrize("config", [
    {},  # the default: guarded-srpf (LPRS and APC only with a fitted model)
    {"lprs": {"enabled": True}, "apc": {"enabled": True}},  # both on the built-in model
    {"lprs": {"enabled": False}, "apc": {"enabled": True}},
    {"lprs": {"enabled": True}, "apc": {"enabled": False}},
], ids=["default", "lprs-apc", "apc", "lprs"])
def test_with_chunked_prefill_off_every_prompt_is_prefilled_whole(config_only_model,
                                                                   config) -> None:
    # --no-enable-chunked-prefill: vLLM runs each prompt in one step, and a KV connector
    # such as vLLM's ExampleConnector saves a prompt's KV from that step alone.
    lengths = [40, 70, 100, 150, 200, 260, 330, 400, 500, 600, 750, 900]
    first: dict[str, int] = {}
    for seed in range(6):
        random.Random(seed).shuffle(lengths)
        scheduler = make_scheduler(FairSyncScheduler, config_only_model, block_size=32,
                                   max_num_batched_tokens=1024, max_model_len=1024,
                                   max_num_seqs=8, num_blocks=4000, async_scheduling=False,
                                   enable_chunked_prefill=False,
                                   additional_config={"fairsched": config})
        engine = OfflineEngine(scheduler)
        requests = [make_request(f"s{seed}-r{i}-{n}", n, 1, arrival_time=1.0 + i * 0.001)
                    for i, n in enumerate(lengths)]
        pending = requests[:] if seed % 2 else []
        if not pending:
            engine.add(requests)
        for _ in range(200):
            if pending:
                engine.add([pending.pop(0)])
            if not (scheduler.waiting or scheduler.running or pending):
                break
            for req_id, tokens in engine.step().output.num_scheduled_tokens.items():
                first.setdefault(req_id, tokens)
    assert len(first) == 6 * len(lengths)
    assert {req_id: int(req_id.rsplit("-", 1)[1]) for req_id in first} == first
