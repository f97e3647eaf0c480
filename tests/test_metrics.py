"""Run metrics against values worked out by hand."""

from __future__ import annotations

import json

import pytest

from fairsched_plugin.experiment.metrics import (
    aggregate_repeats,
    jain_index,
    latency_control,
    latency_stats,
    step_deviations,
    summarize_run,
)


def request(
    rid: str, cls: str, tier: int, prompt: int, arrival: float, first: float | None,
    finish: float | None, output: int, error: str | None = None, **extra: float | None,
) -> dict:
    return {
        "id": rid, "class": cls, "tier": tier, "category": "mixed", "prompt_tokens": prompt,
        "target_output_tokens": output, "arrival_s": arrival, "first_token_s": first,
        "finish_s": finish, "output_tokens": output, "error": error, **extra,
    }


# Completed requests, (TTFT, E2E, output tokens):
#   r1 (0.5, 2.5, 5)  r2 (0.2, 1.0, 3)  r3 (1.0, 4.0, 4)  r4 (2.0, 4.0, 1)
# r5 timed out, r6 never finished and has no error message.
REQUESTS = [
    request("r1", "short", 0, 10, 0.0, 0.5, 2.5, 5, prefill_done_s=0.4),
    request("r2", "short", 0, 20, 1.0, 1.2, 2.0, 3),
    request("r3", "medium", 1, 200, 2.0, 3.0, 6.0, 4),
    request("r4", "long", 1, 2000, 3.0, 5.0, 7.0, 1),
    request("r5", "medium", 0, 300, 4.0, None, None, 0, error="timeout"),
    request("r6", "long", 2, 3000, 4.5, 5.5, None, 2),
]

TRACE = [
    {"step": 0, "t": 100.0, "step_time_s": 0.1, "num_decodes": 0, "decode_tokens": 0,
     "num_prefills": 2, "prefill_tokens": 30, "prefill_chunks": [10, 20],
     "num_running": 2, "num_waiting": 1},
    {"step": 1, "t": 100.1, "step_time_s": None, "num_decodes": 2, "decode_tokens": 2,
     "num_prefills": 1, "prefill_tokens": 64, "prefill_chunks": [64],
     "num_running": 3, "num_waiting": 0},
    {"step": 2, "t": 100.3, "step_time_s": 0.3, "num_decodes": 3, "decode_tokens": 3,
     "num_prefills": 0, "prefill_tokens": 0, "prefill_chunks": [],
     "num_running": 3, "num_waiting": 0},
]


@pytest.fixture(scope="module")
def summary() -> dict:
    return summarize_run(REQUESTS, TRACE)


def test_latency_stats_linear_percentiles() -> None:
    # sorted [0.2, 0.5, 1.0, 2.0]; the q-th percentile sits at index (n - 1) q = 3q
    stats = latency_stats([0.5, 0.2, 1.0, 2.0])
    assert stats["count"] == 4
    assert stats["mean"] == pytest.approx(3.7 / 4)
    assert stats["p50"] == pytest.approx(0.5 + 0.5 * (1.0 - 0.5))  # index 1.5
    assert stats["p80"] == pytest.approx(1.0 + 0.4 * (2.0 - 1.0))  # index 2.4
    assert stats["p90"] == pytest.approx(1.7)  # index 2.7
    assert stats["p95"] == pytest.approx(1.85)  # index 2.85
    assert stats["p99"] == pytest.approx(1.97)  # index 2.97
    assert stats["max"] == 2.0


def test_latency_stats_empty_is_none_not_zero() -> None:
    assert latency_stats([]) == {
        "count": 0, "mean": None, "p50": None, "p80": None, "p90": None,
        "p95": None, "p99": None, "max": None,
    }


def test_latencies_of_completed_requests(summary: dict) -> None:
    latency = summary["latency"]
    assert latency["ttft_s"]["mean"] == pytest.approx((0.5 + 0.2 + 1.0 + 2.0) / 4)
    assert latency["ttft_s"]["p50"] == pytest.approx(0.75)
    # E2E sorted [1.0, 2.5, 4.0, 4.0]: P50 at index 1.5
    assert latency["e2e_s"]["mean"] == pytest.approx((2.5 + 1.0 + 4.0 + 4.0) / 4)
    assert latency["e2e_s"]["p50"] == pytest.approx(2.5 + 0.5 * 1.5)
    assert latency["e2e_s"]["max"] == 4.0
    # TPOT: r1 (2.5-0.5)/4 = 0.5, r2 (2.0-1.2)/2 = 0.4, r3 (6-3)/3 = 1.0; r4 has one token
    assert latency["tpot_s"]["count"] == 3
    assert latency["tpot_s"]["mean"] == pytest.approx((0.5 + 0.4 + 1.0) / 3)
    # queue = TTFT; execution = E2E - TTFT = [2.0, 0.8, 3.0, 2.0]
    assert latency["queue_s"] == latency["ttft_s"]
    assert latency["execution_s"]["mean"] == pytest.approx((2.0 + 0.8 + 3.0 + 2.0) / 4)


def test_prefill_e2e_uses_trace_join_else_ttft(summary: dict) -> None:
    # r1 joined: 0.4 - 0.0; the rest fall back to TTFT 0.2, 1.0, 2.0
    prefill_e2e = summary["latency"]["prefill_e2e_s"]
    assert prefill_e2e["mean"] == pytest.approx((0.4 + 0.2 + 1.0 + 2.0) / 4)
    assert summary["prefill_e2e_source"] == "mixed"
    unjoined = [{**r, "prefill_done_s": None} for r in REQUESTS]
    assert summarize_run(unjoined)["prefill_e2e_source"] == "ttft"
    joined = [{**r, "prefill_done_s": r["arrival_s"] + 0.1} for r in REQUESTS]
    assert summarize_run(joined)["prefill_e2e_source"] == "trace"


def test_failed_requests_counted_and_excluded(summary: dict) -> None:
    assert summary["requests"] == {
        "total": 6, "completed": 4, "failed": 2, "errors": {"timeout": 1, "unfinished": 1},
    }
    assert summary["latency"]["e2e_s"]["count"] == 4
    # r6 had a first token but failed: its TTFT (1.0) must not enter the stats
    assert summary["latency"]["ttft_s"]["count"] == 4


def test_throughput_over_makespan(summary: dict) -> None:
    # first arrival 0.0 (any request), last completed finish 7.0
    throughput = summary["throughput"]
    assert throughput["makespan_s"] == pytest.approx(7.0)
    assert throughput["output_tokens"] == 5 + 3 + 4 + 1
    assert throughput["output_tokens_per_s"] == pytest.approx(13 / 7)
    assert throughput["requests_per_s"] == pytest.approx(4 / 7)
    assert throughput["input_tokens_per_s"] == pytest.approx((10 + 20 + 200 + 2000) / 7)


def test_per_class_and_tier(summary: dict) -> None:
    assert list(summary["by_class"]) == ["short", "medium", "long"]
    short = summary["by_class"]["short"]
    assert (short["requests"], short["completed"]) == (2, 2)
    assert short["latency"]["ttft_s"]["mean"] == pytest.approx((0.5 + 0.2) / 2)
    medium = summary["by_class"]["medium"]
    assert (medium["requests"], medium["completed"]) == (2, 1)
    assert medium["latency"]["e2e_s"]["mean"] == pytest.approx(4.0)
    assert list(summary["by_tier"]) == ["0", "1", "2"]
    assert summary["by_tier"]["1"]["latency"]["e2e_s"]["mean"] == pytest.approx((4.0 + 4.0) / 2)
    assert summary["by_tier"]["2"]["latency"]["e2e_s"]["count"] == 0


def test_jain_index_by_hand() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(1 / 4)
    assert jain_index([]) is None


def test_fairness(summary: dict) -> None:
    # normalised latency E2E / output tokens: 2.5/5 = 1/2, 1.0/3 = 1/3, 4.0/4 = 1, 4.0/1 = 4
    # sum = 35/6, sum of squares = 1/4 + 1/9 + 1 + 16 = 625/36
    # J = (35/6)^2 / (4 * 625/36) = 1225 / 2500 = 0.49
    fairness = summary["fairness"]
    assert fairness["jain_normalised_latency"] == pytest.approx(0.49)
    assert fairness["normalised_latency_mean_s_per_token"] == pytest.approx(35 / 6 / 4)
    assert fairness["max_ttft_s"] == 2.0
    assert fairness["ttft_p99_over_p50"] == pytest.approx(1.97 / 0.75)


def test_batch_efficiency(summary: dict) -> None:
    assert summary["batch"] == pytest.approx({
        "steps": 3,
        "avg_batch_size": (2 + 3 + 3) / 3,
        "avg_tokens_per_step": (30 + 66 + 3) / 3,
        "avg_step_time_s": (0.1 + 0.3) / 2,  # the unmeasured step is skipped
        "steps_per_request": 3 / 4,
        "avg_prefill_chunk_tokens": (10 + 20 + 64) / 3,
        "avg_prefill_seqs_per_step": (2 + 1 + 0) / 3,
    })


@pytest.mark.parametrize("trace", [[], None])
def test_missing_trace(trace: list | None) -> None:
    batch = summarize_run(REQUESTS, trace)["batch"]
    assert batch["steps"] == 0
    assert all(value is None for key, value in batch.items() if key != "steps")


def test_no_completed_request() -> None:
    summary = summarize_run(REQUESTS[4:5], [])
    assert summary["throughput"]["makespan_s"] is None
    assert summary["throughput"]["output_tokens_per_s"] is None
    assert summary["latency"]["e2e_s"]["count"] == 0
    assert summary["fairness"]["jain_normalised_latency"] is None
    assert summary["prefill_e2e_source"] == "none"
    assert summarize_run([], None)["requests"]["total"] == 0


def test_summary_is_plain_json(summary: dict) -> None:
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary


def test_aggregate_repeats_spread() -> None:
    repeats = [
        {"a": 1.0, "b": {"c": 2, "d": None}, "name": "x", "flag": True},
        {"a": 3.0, "b": {"c": 6, "d": None}, "name": "y", "flag": False},
    ]
    # a: mean 2, spread (3 - 1) / 2 = 1; c: mean 4, spread (6 - 2) / 4 = 1
    assert aggregate_repeats(repeats) == {
        "a": {"n": 2, "mean": 2.0, "min": 1.0, "max": 3.0, "spread": 1.0},
        "b": {"c": {"n": 2, "mean": 4.0, "min": 2.0, "max": 6.0, "spread": 1.0}},
    }


def test_aggregate_repeats_of_runs(summary: dict) -> None:
    later = [{**r, "finish_s": r["finish_s"] and r["finish_s"] + 1.0} for r in REQUESTS]
    slower = summarize_run(later, TRACE)
    aggregate = aggregate_repeats([summary, slower])
    e2e_mean = aggregate["latency"]["e2e_s"]["mean"]
    # E2E means 2.875 and 3.875: spread 1 / 3.375
    assert e2e_mean["mean"] == pytest.approx(3.375)
    assert e2e_mean["spread"] == pytest.approx(1 / 3.375)
    assert aggregate["batch"]["steps"]["spread"] == 0.0
    assert aggregate["requests"]["errors"]["timeout"]["mean"] == 1.0
    assert "prefill_e2e_source" not in aggregate
    assert aggregate_repeats([]) == {}


def test_queue_time_uses_trace_admission_when_joined() -> None:
    from fairsched_plugin.experiment.metrics import request_latencies

    request = {"arrival_s": 1.0, "admitted_s": 1.25, "first_token_s": 1.75, "finish_s": 3.0,
               "output_tokens": 6, "error": None}
    latency = request_latencies(request)
    assert latency["queue_s"] == pytest.approx(0.25)      # 1.25 - 1.0
    assert latency["execution_s"] == pytest.approx(1.75)  # E2E 2.0 - queue 0.25
    assert latency["ttft_s"] == pytest.approx(0.75)


def _step(ms: float, prefills: int = 1, **extra) -> dict:
    return {"step_time_s": ms / 1000.0, "num_prefills": prefills, "num_decodes": 1,
            "decode_tokens": 1, "prefill_tokens": 10 * prefills, "prefill_chunks": [10] * prefills,
            **extra}


def test_latency_control_scores_steps_against_the_target():
    trace = [_step(50), _step(54), _step(44), _step(80), _step(20, prefills=0),
             _step(50, lprs_predicted_ms=48.0, lprs_fallback=True, lprs_guard=True,
                   lprs_clamped=["gpu_mem_used_mb"])]
    control = latency_control(trace, target_ms=50.0)
    assert control["steps"] == 6
    assert control["within_10pct"] == pytest.approx(3 / 6)  # 50, 54, 50 (44 is 12 % under)
    assert control["within_10pct_prefill"] == pytest.approx(3 / 5)
    assert control["over_10pct"] == pytest.approx(1 / 6)
    assert control["prediction_mae_ms"] == pytest.approx(2.0)
    assert control["fallback_steps"] == 1
    assert control["guard_steps"] == 1 and control["clamped_steps"] == 1
    assert step_deviations(trace, 50.0)[3] == pytest.approx(0.6)


def test_each_step_is_judged_against_its_own_automatic_target():
    # The automatic target follows the latency model: none before it is predicted (NaN),
    # then 40 ms, then 100 ms. Steps without a target are left out.
    trace = [_step(30, lprs_target_ms=float("nan")), _step(42, lprs_target_ms=40.0),
             _step(60, lprs_target_ms=40.0), _step(100, lprs_target_ms=100.0)]
    control = latency_control(trace)
    assert control["steps"] == 3 and not control["target_fixed"]
    assert control["target_ms"] == 40.0  # the median of the per-step targets
    assert control["within_10pct"] == pytest.approx(2 / 3)  # 42 of 40, 100 of 100
    assert list(step_deviations(trace)) == pytest.approx([0.05, 0.5, 0.0])


def test_summary_takes_the_lprs_target_from_the_trace_and_sums_apc_outcomes():
    trace = [_step(50, lprs_target_ms=50.0, apc={"accepted": 2, "warm_start": 1,
                                                  "blocked_by_cap": 3}),
             _step(30, lprs_target_ms=50.0, apc={"accepted": 1, "forced": 1})]
    summary = summarize_run([], trace)
    assert summary["control"]["target_ms"] == 50.0
    assert summary["control"]["within_10pct"] == 0.5
    assert summary["apc"] == {"accepted": 3, "warm_start": 1, "blocked_by_cap": 3,
                              "forced": 1, "interventions": 5}
    assert "control" not in summarize_run([], [_step(50)])
    assert summarize_run([], [_step(50)], target_ms=50.0)["control"]["within_10pct"] == 1.0


def test_ttft_splits_into_queue_own_prefill_and_after_with_a_trace():
    from fairsched_plugin.experiment.metrics import request_latencies

    base = {"arrival_s": 1.0, "first_token_s": 2.5, "finish_s": 4.0, "output_tokens": 4}
    split = request_latencies({**base, "admitted_s": 1.75, "prefill_done_s": 2.25})
    assert split["queue_s"] == pytest.approx(0.75)
    assert split["prefill_s"] == pytest.approx(0.5)
    assert split["after_prefill_s"] == pytest.approx(0.25)
    assert split["queue_s"] + split["prefill_s"] + split["after_prefill_s"] == pytest.approx(
        split["ttft_s"])
    plain = request_latencies(base)
    assert plain["prefill_s"] is None and plain["after_prefill_s"] is None
