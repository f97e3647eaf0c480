"""vLLM-Ascend integration, with a faked NPU platform (no NPU, CANN or vllm-ascend here).

What is faked, and only this:

- ``FakeNpuPlatform``: vLLM's CPU platform with device type ``npu`` and a
  ``check_and_update_config`` that does what vllm-ascend 0.23.0's ``NPUPlatform`` does to
  the scheduler config (block size 128 with chunked prefill or prefix caching; its
  scheduler class for each scheduler setting), installed as vLLM's current platform (it
  also keeps vLLM from building a ``torch.device("npu")``, which needs torch_npu);
- ``FakeTorchNpu``: the ``torch.npu`` namespace torch_npu adds (``is_initialized``,
  ``current_device``, ``mem_get_info``, ``memory_allocated``, ``memory_reserved``),
  returning fixed numbers.

The scheduler, KV-cache manager, requests and configs are vLLM's own (of whichever vLLM
is on the path: tests/test_vllm_versions.py runs this module on each supported release).
"""

from __future__ import annotations

import logging
import random
import sys

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.adapter import ascend  # noqa: E402
from fairsched_plugin.sim.fake_engine import OfflineEngine, make_request, make_scheduler  # noqa: E402
from fairsched_plugin.config import ConfigError  # noqa: E402
from fairsched_plugin.predictor.memory import make_memory_provider  # noqa: E402
from scheduler_driver import run_workload  # noqa: E402

ASCEND_BLOCK = 128

_ASCEND_CLASSES = {
    "SLO_limits_for_dynamic_batch": "vllm_ascend.core.scheduler_dynamic_batch.SchedulerDynamicBatch",
    "profiling_chunk_config": "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler",
    "recompute_scheduler_enable": "vllm_ascend.core.recompute_scheduler.RecomputeScheduler",
}


class FakeNpuPlatform(CpuPlatform):
    """The NPU platform as the scheduler and the config checks see it (see module doc)."""

    device_name = "npu"
    device_type = "npu"

    @classmethod
    def uses_host_device_handling(cls) -> bool:
        """Keeps vLLM's DeviceConfig from calling ``torch.device("npu")``: torch_npu
        registers that device type on Ascend; plain torch has none."""
        return True

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        extra = vllm_config.additional_config or {}
        cache = vllm_config.cache_config
        if vllm_config.scheduler_config.enable_chunked_prefill or cache.enable_prefix_caching:
            cache.block_size = ASCEND_BLOCK
        if extra.get("SLO_limits_for_dynamic_batch", -1) != -1:
            vllm_config.scheduler_config.scheduler_cls = _ASCEND_CLASSES[
                "SLO_limits_for_dynamic_batch"]
        nested = extra.get("scheduler_config", {})
        if nested.get("profiling_chunk_config", extra.get("profiling_chunk_config", {})).get(
                "enabled"):
            vllm_config.scheduler_config.scheduler_cls = _ASCEND_CLASSES["profiling_chunk_config"]
        if nested.get("recompute_scheduler_enable", extra.get("recompute_scheduler_enable")):
            vllm_config.scheduler_config.scheduler_cls = _ASCEND_CLASSES[
                "recompute_scheduler_enable"]
        if extra.get("future_scheduler"):  # a setting fairsched does not know by name
            # As 0.23.0 does for recompute scheduling: a new scheduler config object.
            from copy import copy

            replaced = copy(vllm_config.scheduler_config)
            replaced.scheduler_cls = "vllm_ascend.core.future.Scheduler"
            vllm_config.scheduler_config = replaced


class _Holder:
    """The two parts of a VllmConfig the platform check reads and writes."""

    def __init__(self, scheduler_config, cache_config, additional_config):
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.additional_config = additional_config


def _vllm_config(scheduler_cls, additional_config):
    from vllm.config import CacheConfig, SchedulerConfig

    scheduler_config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512,
                                       max_model_len=4096, enable_chunked_prefill=True,
                                       is_encoder_decoder=False)
    scheduler_config.scheduler_cls = scheduler_cls
    return _Holder(scheduler_config, CacheConfig(block_size=16), additional_config)


@pytest.fixture
def guarded_platform():
    """A fresh guarded copy of the fake platform for each test."""
    platform = type("GuardedNpuPlatform", (FakeNpuPlatform,), {})
    ascend.guard_platform(platform)
    return platform


@pytest.mark.parametrize("additional_config, named", [
    ({"SLO_limits_for_dynamic_batch": 50}, "additional_config.SLO_limits_for_dynamic_batch=50"),
    ({"profiling_chunk_config": {"enabled": True}},
     "additional_config.profiling_chunk_config.enabled=True"),
    ({"scheduler_config": {"profiling_chunk_config": {"enabled": True}}},
     "additional_config.scheduler_config.profiling_chunk_config.enabled=True"),
    ({"recompute_scheduler_enable": True}, "additional_config.recompute_scheduler_enable=True"),
    ({"scheduler_config": {"short_request_first_config": {"enabled": True}}},
     "additional_config.scheduler_config.short_request_first_config.enabled=True"),
    ({"scheduler_config": {"batch_job_sched_config": {"enabled": True}}},
     "batch_job_sched_config.enabled=True"),
])
@pytest.mark.parametrize("scheduler_cls", ["fairsched_plugin.FairScheduler", None])
def test_a_conflicting_ascend_setting_stops_start_up_naming_it(
        guarded_platform, monkeypatch, additional_config, named, scheduler_cls):
    monkeypatch.setenv("FAIRSCHED_POLICY", "aging")
    config = _vllm_config(scheduler_cls, {"fairsched": {}, **additional_config})
    with pytest.raises(ConfigError) as info:
        guarded_platform.check_and_update_config(config)
    assert named in str(info.value)
    assert "Turn that setting off" in str(info.value)


def test_the_nested_key_wins_over_the_top_level_one_as_in_vllm_ascend():
    assert ascend.ascend_scheduler_conflicts({
        "scheduler_config": {"recompute_scheduler_enable": False},
        "recompute_scheduler_enable": True}) == []
    assert ascend.ascend_scheduler_conflicts({"SLO_limits_for_dynamic_batch": -1}) == []


def test_without_fairsched_the_platform_runs_its_own_scheduler(guarded_platform, monkeypatch):
    monkeypatch.delenv("FAIRSCHED_POLICY", raising=False)
    config = _vllm_config(None, {"SLO_limits_for_dynamic_batch": 50})
    guarded_platform.check_and_update_config(config)
    assert config.scheduler_config.scheduler_cls == _ASCEND_CLASSES[
        "SLO_limits_for_dynamic_batch"]


def test_fairsched_without_conflicts_keeps_its_class_and_gets_block_128(guarded_platform):
    config = _vllm_config("fairsched_plugin.FairScheduler",
                          {"fairsched": {}, "scheduler_config": {"enable_balance_scheduling":
                                                                  True}})
    guarded_platform.check_and_update_config(config)
    assert config.scheduler_config.scheduler_cls == "fairsched_plugin.FairScheduler"
    assert config.cache_config.block_size == ASCEND_BLOCK


def test_an_unknown_platform_swap_is_refused_naming_the_class(guarded_platform):
    config = _vllm_config("fairsched_plugin.FairSyncScheduler", {"future_scheduler": True})
    with pytest.raises(ConfigError, match="vllm_ascend.core.future.Scheduler"):
        guarded_platform.check_and_update_config(config)


def test_guarding_twice_wraps_once(guarded_platform):
    wrapped = guarded_platform.check_and_update_config
    ascend.guard_platform(guarded_platform)
    assert guarded_platform.check_and_update_config == wrapped


@pytest.fixture
def npu_platform(monkeypatch):
    """vLLM's current platform is the fake NPU one for the duration of a test, also in
    the vLLM modules that bound ``current_platform`` when imported (0.34's config)."""
    real = vllm.platforms.current_platform
    fake = FakeNpuPlatform()
    monkeypatch.setattr(vllm.platforms, "_current_platform", fake)
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(module, "current_platform", None) is real:
            monkeypatch.setattr(module, "current_platform", fake)
    assert vllm.platforms.current_platform.device_type == "npu"
    yield vllm.platforms.current_platform


def test_plugin_guards_the_npu_platform_it_finds(npu_platform):
    from fairsched_plugin.plugin import register

    register()
    assert getattr(type(npu_platform).check_and_update_config.__func__,
                   "_fairsched_guarded", False)
    # The CPU platform (the real one here) is never touched.
    assert not getattr(CpuPlatform.check_and_update_config.__func__, "_fairsched_guarded",
                       False)


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_on_npu_chunk_ends_align_to_the_128_block_by_default(config_only_model, npu_platform,
                                                            cls, caplog):
    """lprs.align defaults to "auto": on for device type npu, with vLLM-Ascend's block
    size; a long prompt's chunks (budget 300) end on multiples of 128 until its last."""
    with caplog.at_level(logging.INFO, logger="vllm.fairsched"):
        scheduler = make_scheduler(cls, config_only_model, block_size=ASCEND_BLOCK,
                                   max_num_batched_tokens=300, async_scheduling=cls is FairScheduler,
                                   additional_config={"fairsched": {"policy": "aging"}})
    assert "platform npu" in caplog.text
    assert "scheduler hooks:" in caplog.text
    engine = OfflineEngine(scheduler)
    engine.add([make_request("long", 1000, 2, arrival_time=1.0, block_size=ASCEND_BLOCK)])
    ends = []
    while scheduler.requests["long"].num_computed_tokens < 1000:
        engine.step()
        ends.append(scheduler.requests["long"].num_computed_tokens)
    assert ends[0] == 256
    assert all(end % ASCEND_BLOCK == 0 for end in ends[:-1]) and ends[-1] == 1000


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
@pytest.mark.parametrize("policy", ["aging", "guarded-srpf", "fcfs"])
def test_on_npu_a_random_workload_finishes_within_budget(config_only_model, npu_platform,
                                                        cls, policy):
    rng = random.Random(7)
    budget = 512
    engine = OfflineEngine(make_scheduler(
        cls, config_only_model, block_size=ASCEND_BLOCK, max_num_batched_tokens=budget,
        num_blocks=400, async_scheduling=cls is FairScheduler,
        additional_config={"fairsched": {"policy": policy}}))
    workload = [(step, make_request(f"r{step}", rng.randint(10, 1500), rng.randint(1, 8),
                                    arrival_time=float(step), block_size=ASCEND_BLOCK))
                for step in sorted(rng.sample(range(60), 30))]

    def aligned(record) -> None:
        for req_id, n in record.output.num_scheduled_tokens.items():
            request = engine.scheduler.requests.get(req_id)
            if request is not None and request.num_computed_tokens < request.num_prompt_tokens:
                # A prefill chunk that did not finish the prompt ends on a block boundary.
                assert request.num_computed_tokens % ASCEND_BLOCK == 0, (req_id, n)

    run_workload(engine, workload, budget=budget, check=aligned)
    assert not engine.scheduler.requests
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 399


class FakeTorchNpu:
    """torch_npu's ``torch.npu`` namespace with one initialised device (see module doc)."""

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 3

    def mem_get_info(self, device: int) -> tuple[int, int]:
        assert device == 3
        return 40 << 30, 64 << 30

    def memory_allocated(self, device: int) -> int:
        return 20 << 30

    def memory_reserved(self, device: int) -> int:
        return 22 << 30


def test_npu_memory_comes_from_torch_npu(monkeypatch):
    monkeypatch.setattr(torch, "npu", FakeTorchNpu(), raising=False)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("a CUDA device is initialised here; it would be read first")
    provider = make_memory_provider("auto", lambda: (0, 1, 1))
    assert provider.name == "torch"
    state = provider.read()
    assert (state.used_mb, state.free_mb) == (24 * 1024, 40 * 1024)
    assert (state.allocated_mb, state.reserved_mb) == (20 * 1024, 22 * 1024)


def test_cann_provider_options_are_validated_and_reach_the_provider():
    """device id and precision mode from the config; a bad precision mode or an option the
    CANN provider does not parse stops start-up (naming it) instead of the provider
    silently refusing it and falling back to CPU."""
    from fairsched_plugin.config import load_config
    from fairsched_plugin.predictor.runtime import PredictorError, _provider_options

    config = load_config({"fairsched": {"predictor": {
        "provider": "cann", "device_id": 2, "precision_mode": "FORCE_FP32"}}}, environ={})
    assert config.predictor.precision_mode == "force_fp32"
    options = _provider_options("cann", config.predictor.device_id, 1,
                                {"precision_mode": config.predictor.precision_mode})
    assert options["device_id"] == "2" and options["precision_mode"] == "force_fp32"
    assert _provider_options("cann", 0, 1, None)["precision_mode"] == "must_keep_origin_dtype"
    with pytest.raises(ConfigError, match="predictor.precision_mode"):
        load_config({"fairsched": {"predictor": {"precision_mode": "fp8"}}}, environ={})
    with pytest.raises(PredictorError, match="unknown option\\(s\\) cache_dir"):
        _provider_options("cann", 0, 1, {"cache_dir": "/tmp"})
