"""The ``fairsched:`` figures an engine writes, checked against what its scheduler did.

The recorder alone on hand-made sequences, then vLLM's own scheduler with fake outputs
(``sim.fake_engine``) on a virtual clock: every request counted once, waits equal to the
clock's, requests passed by a later arrival counted as reordered, requests aborted while
waiting counted as abandoned, guard deadlines passed counted as overdue, and a failing
piece of the plugin's work counted by place.
"""

from __future__ import annotations

import json
import time

import pytest

from fairsched_plugin.metrics.recorder import WAIT_BUCKETS, MetricsRecorder
from fairsched_plugin.metrics.snapshot import read_snapshots


def test_classes_follow_the_edges():
    recorder = MetricsRecorder((128, 1024))
    assert [recorder.request_class(n) for n in (1, 127, 128, 1024, 1025)] == [
        "short", "short", "medium", "medium", "long"]


def test_a_request_passed_by_a_later_one_makes_that_one_reordered():
    recorder = MetricsRecorder((128, 1024))
    recorder.on_arrival("long", 0.0, 3000, 0, None)
    recorder.on_arrival("short", 1.0, 10, 0, None)
    recorder.on_scheduled(["short"], 1.5, None)
    recorder.on_scheduled(["long"], 4.0, None)
    recorder.on_scheduled(["long"], 9.0, None)  # a later chunk: not a first admission
    assert recorder.reordered == 1
    waits = {key: h.total for key, h in recorder.queue_wait.items()}
    assert waits == {("short", "0"): 0.5, ("long", "0"): 4.0}


def test_overdue_lateness_is_dated_by_the_served_work():
    recorder = MetricsRecorder((128, 1024))
    recorder.on_arrival("a", 0.0, 100, 1, deadline=300.0)
    for t, served in ((1.0, 100), (2.0, 300), (3.0, 500)):
        recorder.on_step({}, served, t)
    recorder.on_scheduled(["a"], 3.5, served=500)
    assert recorder.overdue == 1
    assert recorder.lateness.total == pytest.approx(1.5)  # passed at t=2.0


def test_the_queue_counts_the_prompt_tokens_still_waiting_per_class():
    recorder = MetricsRecorder((128, 1024))
    for req_id, tokens in (("a", 3000), ("b", 2000), ("c", 40), ("d", 500)):
        recorder.on_arrival(req_id, 0.0, tokens, 0, None)
    recorder.on_scheduled(["b"], 1.0, None)  # admitted: no longer queued work
    recorder.on_finished("d")  # aborted while waiting
    queue = recorder.queue(2.0)
    assert {k: v["prompt_tokens"] for k, v in queue.items()} == {
        "short": 40, "medium": 0, "long": 3000}
    assert {k: v["waiting"] for k, v in queue.items()} == {"short": 1, "medium": 0, "long": 1}


def test_an_abort_before_any_step_is_abandoned_not_a_wait():
    recorder = MetricsRecorder((128, 1024))
    recorder.on_arrival("a", 0.0, 2000, 2, None)
    recorder.on_finished("a")
    recorder.on_finished("a")
    assert recorder.abandoned == {("long", "2"): 1}
    assert not recorder.queue_wait


# ----------------------------------------------------------------- vLLM's scheduler

pytest.importorskip("vllm")

from fairsched_plugin import FairScheduler  # noqa: E402
from fairsched_plugin.sim.fake_engine import OfflineEngine, make_request, make_scheduler  # noqa: E402
from linear_onnx import write_linear_model  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _engine(model_dir, tmp_path, clock, **fairsched):
    fairsched.setdefault("metrics", {})
    fairsched["metrics"] = {"dir": str(tmp_path), "interval_s": 1000.0, **fairsched["metrics"]}
    scheduler = make_scheduler(FairScheduler, model_dir, max_num_batched_tokens=512,
                               additional_config={"fairsched": fairsched}, clock=clock)
    return OfflineEngine(scheduler)


def _snapshot(engine, tmp_path):
    [document] = read_snapshots(str(tmp_path), engine.scheduler.vllm_config.instance_id)
    return document


def _run(engine, clock, steps=10_000):
    for _ in range(steps):
        if not engine.scheduler.has_unfinished_requests():
            break
        engine.step()
        clock.now += 0.01
    engine.drain()


def test_every_request_is_counted_once_with_the_clock_s_wait(config_only_model, tmp_path):
    clock = Clock()
    # The guard's order from the first request (the tail watch would start in arrival order).
    engine = _engine(config_only_model, tmp_path, clock, guarded_srpf={"tail_window": 0, "overtake_running": True})
    document = _snapshot(engine, tmp_path)  # written at start-up, before any traffic
    assert document["queue_wait"] == [] and document["reordered"] == 0
    assert document["policy"]["name"] == "guarded-srpf"
    requests = ([make_request("long", 3000, 4, clock.now)]
                + [make_request(f"s{i}", 100, 4, clock.now + 0.001 * (i + 1), priority=i % 2)
                   for i in range(8)])
    engine.add(requests)
    clock.now += 0.5
    _run(engine, clock)
    document = _snapshot(engine, tmp_path)  # the idle engine wrote its last figures
    counts = {(e["class"], e["tier"]): sum(e["counts"]) for e in document["queue_wait"]}
    assert counts == {("long", "0"): 1, ("short", "0"): 4, ("short", "1"): 4}
    first = {}
    for n, record in enumerate(engine.steps):
        for new in record.output.scheduled_new_reqs:
            first.setdefault(new.req_id, n)
    arrival = {r.request_id: r.arrival_time for r in requests}
    passed_an_earlier_one = {
        r for r in first
        if any(arrival[q] < arrival[r] and first[q] > first[r] for q in first)}
    # The short prompts pass the long one that arrived first (five 100-token prompts
    # fill the first 512-token step).
    assert document["reordered"] == len(passed_an_earlier_one) >= 5
    assert document["overdue"]["count"] == 0
    assert document["queue"]["short"]["waiting"] == 0
    assert len(first) == 9 and 0 < document["steps"] <= len(engine.steps)
    total = sum(e["sum"] for e in document["queue_wait"])
    assert total >= 9 * 0.49  # every request waited the 0.5 s before the first step
    assert len(document["wait_buckets"]) == len(WAIT_BUCKETS)


def test_the_control_reorders_nothing(config_only_model, tmp_path):
    clock = Clock()
    engine = _engine(config_only_model, tmp_path, clock, policy="fcfs")
    engine.add([make_request("long", 3000, 4, clock.now)]
               + [make_request(f"s{i}", 32, 4, clock.now + 0.001 * (i + 1)) for i in range(8)])
    _run(engine, clock)
    document = _snapshot(engine, tmp_path)
    assert document["reordered"] == 0
    assert "overdue" not in document and "alpha" not in document


def test_requests_past_their_deadline_are_overdue(config_only_model, tmp_path):
    """Slack 0.01 and no allowance: a request is overdue once any prefill work is served
    after it arrived; the long prompt takes six 512-token steps, so every short prompt
    that arrives after its first step and is not admitted in its arrival step is late."""
    clock = Clock()
    engine = _engine(config_only_model, tmp_path, clock,
                     guarded_srpf={"slack": 0.01, "size_allowance": 0, "tail_window": 0, "overtake_running": True})
    engine.add([make_request("long", 3000, 4, clock.now)])
    engine.step()
    clock.now += 0.01
    engine.add([make_request(f"s{i}", 200, 4, clock.now) for i in range(8)])
    _run(engine, clock)
    document = _snapshot(engine, tmp_path)
    served_after = [new.req_id for record in engine.steps[2:]
                    for new in record.output.scheduled_new_reqs]
    assert document["overdue"]["count"] == len(served_after) > 0
    assert document["overdue"]["sum"] > 0


def test_an_abort_while_waiting_is_abandoned(config_only_model, tmp_path):
    clock = Clock()
    engine = _engine(config_only_model, tmp_path, clock)
    engine.add([make_request("a", 3000, 4, clock.now), make_request("b", 3000, 4, clock.now)])
    engine.step()
    from vllm.v1.request import RequestStatus

    engine.scheduler.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    _run(engine, clock)
    document = _snapshot(engine, tmp_path)
    assert document["abandoned"] == [{"class": "long", "tier": "0", "count": 1}]
    assert sum(sum(e["counts"]) for e in document["queue_wait"]) == 1


@pytest.mark.degrades
def test_a_failing_trace_write_is_counted_by_place(config_only_model, tmp_path):
    """``/dev/full`` refuses every write (a full disk): each step's trace fails and runs
    as stock vLLM would, and the snapshot counts it."""
    clock = Clock()
    engine = _engine(config_only_model, tmp_path, clock, trace_path="/dev/full")
    engine.add([make_request("a", 100, 4, clock.now)])
    _run(engine, clock)
    document = _snapshot(engine, tmp_path)
    assert document["failures"].get("the step trace and its listeners", 0) >= 1


def test_metrics_off_writes_nothing(config_only_model, tmp_path):
    clock = Clock()
    engine = _engine(config_only_model, tmp_path, clock, metrics={"enabled": False})
    engine.add([make_request("a", 100, 4, clock.now)])
    _run(engine, clock)
    assert not list(tmp_path.iterdir())
    assert engine.scheduler._metrics is None


def test_lprs_fallbacks_prediction_error_and_apc_are_counted(config_only_model, tmp_path):
    """A latency model 100x too high for steps of about 1 ms: LPRS's guard hands the steps
    back to the token budget, and the snapshot says so, with the prediction error of every
    measured batch and APC's decisions."""
    model = write_linear_model(tmp_path / "high.onnx", base_ms=100.0, per_token_ms=0.05)
    # The wall clock: the guard judges measured step times.
    engine = _engine(config_only_model, tmp_path / "metrics", None, policy="fcfs",
                     predictor={"path": str(model)},
                     lprs={"enabled": True, "target_ms": 21.0, "granularity": 32,
                           "correction": 0.0, "guard_window": 4},
                     apc={"enabled": True})
    engine.model_time_s = 0.001
    engine.add([make_request("long", 2000, 2, time.time())])
    engine.run_until_idle()
    document = _snapshot(engine, tmp_path / "metrics")
    lprs = document["lprs"]
    assert lprs["fallback_steps"]["guard"] > 0 and lprs["fallback_steps"]["predictor_error"] == 0
    assert sum(lprs["error"]["counts"]) > 0
    assert lprs["error"]["sum"] / sum(lprs["error"]["counts"]) > 5  # predictions ~100x off
    assert lprs["target_ms"] == 21.0
    assert document["apc"]["accepted"] > 0


def test_aging_reports_its_alpha(config_only_model, tmp_path):
    clock = Clock()
    engine = _engine(config_only_model, tmp_path, clock, policy="aging",
                     aging={"alpha": 37.5})
    assert _snapshot(engine, tmp_path)["alpha"] == 37.5
    automatic = _engine(config_only_model, tmp_path / "auto", clock, policy="guarded-aging")
    assert _snapshot(automatic, tmp_path / "auto")["alpha"] is None  # not measured yet


def test_a_target_not_predicted_yet_is_written_as_null(config_only_model, tmp_path):
    """``GET /fairsched`` serves the snapshot as strict JSON: NaN would make it fail."""
    engine = _engine(config_only_model, tmp_path, Clock(), lprs={"enabled": True})
    lprs = _snapshot(engine, tmp_path)["lprs"]
    assert lprs["target_ms"] is None  # the CPU has no preset: nothing predicted at start-up
    json.dumps(lprs, allow_nan=False)
