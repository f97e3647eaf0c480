"""fairsched composed with vLLM-Ascend's real ``BalanceScheduler``, on the vLLM it pairs with:
0.23.0's on vLLM 0.23.0 and 0.30.0rc2's (the newest on PyPI) on vLLM 0.30.0.

vLLM-Ascend installs ``BalanceScheduler`` as ``vllm.v1.core.sched.scheduler.Scheduler``
before any scheduler class is resolved; with balance scheduling on it runs its own copy of
vLLM's ``schedule()``, which calls only ``_mamba_block_aligned_split`` (also in 0.30.0rc2,
over a vLLM that has ``_reserve_prefill_lookahead``). Here that real source file (kept by
``scripts/vllm_overlays.sh`` from vLLM-Ascend's wheel or sdist) is loaded over the vLLM
overlay exactly so, and fairsched's sync scheduler, imported afterwards, must derive from
it and still apply its caps inside that copy.

Faked: the vLLM-Ascend modules the file imports (the real ones import torch_npu):
``vllm_ascend.utils.vllm_version_is`` (0.23.0), compared with ``vllm.__version__`` as the
real one does, and ``vllm_ascend.ascend_config`` (0.30.0rc2): no Ascend config is
initialised (as before vLLM-Ascend's platform sets it up), so the file falls back to
``additional_config`` for balance scheduling, and short-request-first is off. Needs a fresh
interpreter (``tests/test_vllm_versions.py`` runs it alone), since fairsched's classes must
be created after the replacement.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import types
from pathlib import Path

import pytest

SOURCE = os.environ.get("ASCEND_BALANCE_SOURCE", "")
if not SOURCE or not Path(SOURCE).is_file():
    pytest.skip("run by tests/test_vllm_versions.py with a vLLM-Ascend BalanceScheduler source",
                allow_module_level=True)
if "fairsched_plugin.adapter.scheduler" in sys.modules:
    pytest.skip("fairsched's scheduler was imported before BalanceScheduler replaced "
                "vLLM's Scheduler; run this module alone", allow_module_level=True)

import vllm  # noqa: E402
from packaging.version import Version  # noqa: E402

_utils = types.ModuleType("vllm_ascend.utils")
_utils.vllm_version_is = lambda target: Version(vllm.__version__) == Version(target)
sys.modules.setdefault("vllm_ascend", types.ModuleType("vllm_ascend"))
sys.modules["vllm_ascend.utils"] = _utils


def _no_ascend_config():
    raise RuntimeError("the Ascend config is not initialised (no NPU platform here)")


_ascend_config = types.ModuleType("vllm_ascend.ascend_config")
_ascend_config.get_ascend_config = _no_ascend_config
_ascend_config.init_ascend_config = lambda vllm_config: types.SimpleNamespace(
    scheduler_config=types.SimpleNamespace(
        short_request_first_config=types.SimpleNamespace(enabled=False)))
sys.modules["vllm_ascend.ascend_config"] = _ascend_config

_spec = importlib.util.spec_from_file_location("patch_balance_schedule", SOURCE)
balance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(balance)

import vllm.v1.core.sched.scheduler as vllm_scheduler  # noqa: E402

from fairsched_plugin.adapter import compat  # noqa: E402
from fairsched_plugin.sim.fake_engine import OfflineEngine, make_request, make_scheduler  # noqa: E402
from fairsched_plugin.adapter.scheduler import FairSyncScheduler  # noqa: E402
from scheduler_driver import run_workload  # noqa: E402


def _scheduler(model_dir, config, **kwargs):
    scheduler = make_scheduler(
        FairSyncScheduler, model_dir, async_scheduling=False,
        additional_config={"fairsched": config, "enable_balance_scheduling": True}, **kwargs)
    # The copy of schedule() runs only with balance scheduling on.
    assert scheduler._balance_enabled is True
    return scheduler


def test_fairsched_derives_from_balance_scheduler_and_uses_the_split_hook():
    assert vllm_scheduler.Scheduler is balance.BalanceScheduler
    assert balance.BalanceScheduler in FairSyncScheduler.__mro__
    assert compat.detect_surface(balance.BalanceScheduler).cap_hook == compat.MAMBA_SPLIT


def test_caps_apply_inside_balance_schedulers_copy(config_only_model):
    """Alignment (block 16) cuts the 100-token budget to 96 in BalanceScheduler's loop."""
    engine = OfflineEngine(_scheduler(config_only_model,
                                      {"policy": "fcfs", "lprs": {"align": "on"}},
                                      max_num_batched_tokens=100))
    engine.add([make_request("a", 250, 2, arrival_time=1.0)])
    assert engine.step().output.num_scheduled_tokens["a"] == 96


def test_short_request_overtakes_a_running_long_prefill(config_only_model):
    engine = OfflineEngine(_scheduler(config_only_model, {"policy": "aging",
                                                          "aging": {"alpha": 1.0}},
                                      max_num_batched_tokens=64))
    engine.add([make_request("long", 2000, 2, arrival_time=1.0)])
    engine.step()
    engine.add([make_request("short", 20, 2, arrival_time=1.1)])
    record = engine.step()
    assert record.output.num_scheduled_tokens.get("short") == 20


@pytest.mark.parametrize("policy", ["aging", "guarded-srpf", "srtf"])
def test_random_workload_finishes_and_leaks_nothing(config_only_model, policy):
    rng = random.Random(3)
    engine = OfflineEngine(_scheduler(config_only_model, {"policy": policy},
                                      max_num_batched_tokens=256, num_blocks=600))
    workload = [(step, make_request(f"r{step}", rng.randint(5, 900), rng.randint(1, 6),
                                    arrival_time=float(step)))
                for step in sorted(rng.sample(range(80), 40))]
    run_workload(engine, workload, budget=256, abort_every=17)
    assert not engine.scheduler.requests
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 599
