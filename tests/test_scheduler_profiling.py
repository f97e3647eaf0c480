"""The scheduler's predictor profile: one CSV row per step, with the batch's raw features
as the scheduler built the batch and the measured step time (real vLLM scheduler, fake
model outputs that take a fixed time)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("vllm")

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.sim.fake_engine import (  # noqa: E402
    OfflineEngine,
    make_request,
    make_scheduler,
)
from fairsched_plugin.predictor.features import RAW_FEATURES  # noqa: E402
from fairsched_plugin.predictor.profiling import meta_path, read_profile  # noqa: E402

COLUMN = {name: i for i, name in enumerate(RAW_FEATURES)}


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_every_step_is_profiled_with_its_batch_features_and_time(
    config_only_model, tmp_path, cls
):
    path = tmp_path / "profile.csv"
    trace = tmp_path / "trace.jsonl"
    scheduler = make_scheduler(
        cls, config_only_model, max_num_batched_tokens=64, num_blocks=500,
        async_scheduling=cls is FairScheduler,
        additional_config={"fairsched": {"policy": "fcfs", "trace_path": str(trace),
                                         "profile": {"path": str(path)}}},
    )
    engine = OfflineEngine(scheduler, model_time_s=0.002)
    engine.add([make_request("a", 100, 5, arrival_time=1.0),
                make_request("b", 30, 8, arrival_time=2.0)])
    engine.run_until_idle()
    scheduler.shutdown()
    # An async engine may schedule an empty step at the end: no batch, no row.
    scheduled = [sum(step.output.num_scheduled_tokens.values()) for step in engine.steps]
    scheduled = [tokens for tokens in scheduled if tokens]

    raw, latency_ms, meta = read_profile(path)
    assert meta["memory_provider"] == "kv_cache"
    assert json.loads(meta_path(path).read_text())["max_num_batched_tokens"] == 64
    assert len(raw) == len(scheduled)
    assert np.all(latency_ms >= 1.5)  # each fake forward pass sleeps 2 ms
    assert list(raw[:, COLUMN["prefill_tokens"]] + raw[:, COLUMN["decode_tokens"]]) == scheduled
    # Step 1: 64 tokens of "a" (first chunk, nothing computed before).
    assert raw[0, COLUMN["prefill_tokens"]] == 64
    assert raw[0, COLUMN["prefill_processed_tokens"]] == 0
    # Step 2: the rest of "a" (36, after 64) and 28 of "b".
    assert raw[1, COLUMN["prefill_tokens"]] == 64
    assert raw[1, COLUMN["max_prefill_processed_tokens"]] == 64
    assert raw[1, COLUMN["batch_request_count"]] == 2
    # Memory: the KV cache as the scheduler holds it, used + free = whole pool.
    total = raw[:, COLUMN["gpu_mem_used_mb"]] + raw[:, COLUMN["gpu_mem_free_mb"]]
    assert np.allclose(total, total[0]) and total[0] > 0
    assert raw[0, COLUMN["gpu_mem_used_mb"]] < raw[1, COLUMN["gpu_mem_used_mb"]]
    # The trace carries the same features, so LPRS reports can compare prediction and time.
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert np.allclose([r["batch_features"] for r in records], raw, rtol=1e-9)


def test_an_unavailable_memory_provider_stops_start_up(config_only_model, tmp_path):
    with pytest.raises(ValueError, match="nvml"):
        make_scheduler(
            FairSyncScheduler, config_only_model, async_scheduling=False,
            additional_config={"fairsched": {"profile": {"path": str(tmp_path / "p.csv"),
                                                         "memory": "nvml"}}},
        )
