"""adapter/compat.py against the vLLM on the path: the installed 0.32, or an older release's
scheduler source placed over it (tests/test_vllm_versions.py runs this module per overlay).

The expected surface per release is the version table of the reference notes, checked
against each release's source; detection itself never looks at the version number, so
these tests compare two independent readings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

import vllm  # noqa: E402
from packaging.version import Version  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.adapter import compat  # noqa: E402
from fairsched_plugin.sim.fake_engine import OfflineEngine, make_request, make_scheduler  # noqa: E402

VERSION = Version(Version(vllm.__version__).base_version)


def test_the_vllm_under_test_is_the_one_asked_for():
    """The per-version runs set EXPECT_VLLM_VERSION: an overlay that did not take
    effect would otherwise test 0.32 four times."""
    expected = os.environ.get("EXPECT_VLLM_VERSION")
    if expected is None:
        pytest.skip("not a per-version run")
    assert vllm.__version__.split("+")[0] == expected


def test_detected_surface_matches_the_release_table():
    surface = compat.detect_surface(Scheduler)
    assert surface.cap_hook == (compat.RESERVE if VERSION >= Version("0.28")
                                else compat.MAMBA_SPLIT)
    renamed = VERSION >= Version("0.31")
    assert surface.kv_holding_queue == ("kv_holding_waiting" if renamed else "skipped_waiting")
    assert surface.max_active_attribute == ("max_num_active_reqs" if renamed
                                            else "max_num_running_reqs")
    old = VERSION < Version("0.24")
    assert surface.schedule_throttles is not old
    assert surface.preempt_drops_stale_output is not old
    assert surface.has_kv_cache_usage is not old
    if old or VERSION >= Version("0.27.1"):
        assert surface.has_kv_delivery is not old


@pytest.mark.parametrize("cls", [FairScheduler, FairSyncScheduler])
def test_aliases_reach_vllms_own_attributes(config_only_model, cls):
    scheduler = make_scheduler(cls, config_only_model, async_scheduling=cls is FairScheduler,
                               max_num_seqs=7, additional_config={"fairsched": {}})
    surface = compat.detect_surface(Scheduler)
    assert scheduler.max_num_active_reqs == 7
    assert getattr(scheduler, surface.max_active_attribute) == 7
    # The policy queue the adapter installed is the one vLLM's own loop reads.
    assert getattr(scheduler, surface.kv_holding_queue) is scheduler.kv_holding_waiting
    assert 0.0 <= scheduler.get_kv_cache_usage() <= 1.0


def test_mamba_flag_is_on_only_during_schedule_and_the_cap_is_applied(config_only_model):
    """Whatever the mechanism, the cap hook runs for every scheduled request inside
    ``schedule()``; under the split mechanism the model's flag is restored after."""
    seen: list[tuple[str, bool]] = []

    class Recording(FairSyncScheduler):
        def _reserve_prefill_lookahead(self, request, num_computed_tokens, num_new_tokens):
            seen.append((request.request_id, self.need_mamba_block_aligned_split))
            return super()._reserve_prefill_lookahead(request, num_computed_tokens,
                                                      num_new_tokens)

    engine = OfflineEngine(make_scheduler(
        Recording, config_only_model, async_scheduling=False, max_num_batched_tokens=100,
        additional_config={"fairsched": {"policy": "fcfs", "lprs": {"align": "on"}}}))
    assert engine.scheduler.need_mamba_block_aligned_split is False
    engine.add([make_request("a", 250, 2, arrival_time=1.0)])
    record = engine.step()
    assert engine.scheduler.need_mamba_block_aligned_split is False
    assert ("a", compat.detect_surface(Scheduler).cap_hook == compat.MAMBA_SPLIT) in seen
    # Alignment's cap (block 16) cut vLLM's 100 tokens to 96.
    assert record.output.num_scheduled_tokens["a"] == 96


@pytest.mark.skipif(VERSION >= Version("0.28"), reason="the split mechanism is for < 0.28")
def test_vllms_own_split_still_runs_first_for_a_model_that_needs_it(config_only_model):
    """A hybrid Mamba model sets the flag in vLLM's __init__; vLLM's split then aligns the
    chunk to the block (here 16: 100 -> 96) before the adapter's cap, with fcfs and no
    chunk rule (so the cap alone would leave 100)."""
    scheduler = make_scheduler(FairSyncScheduler, config_only_model, async_scheduling=False,
                               max_num_batched_tokens=100,
                               additional_config={"fairsched": {"policy": "fcfs",
                                                                "lprs": {"align": "off"}}})
    scheduler.need_mamba_block_aligned_split = True
    engine = OfflineEngine(scheduler)
    engine.add([make_request("a", 250, 2, arrival_time=1.0)])
    assert engine.step().output.num_scheduled_tokens["a"] == 96
    assert scheduler.need_mamba_block_aligned_split is True


def test_a_schedule_copy_that_calls_only_the_split_gets_the_split_mechanism():
    """vLLM-Ascend's BalanceScheduler runs its own copy of schedule() that calls
    _mamba_block_aligned_split; the cap must ride on what that copy calls."""

    class SplitOnlyCopy(Scheduler):
        def schedule(self, throttle_prefills: bool = False):
            self._mamba_block_aligned_split(None, 0)
            return super().schedule(throttle_prefills)

    assert compat.detect_surface(SplitOnlyCopy).cap_hook == compat.MAMBA_SPLIT


def test_a_scheduler_without_the_hooks_is_refused_naming_each():
    class Bare:
        def __init__(self):
            self.waiting = []

        def schedule(self):
            return None

    with pytest.raises(compat.UnsupportedVllmError) as info:
        compat.detect_surface(Bare)
    message = str(info.value)
    for name in ("update_from_output is missing", "_preempt_request is missing",
                 compat.RESERVE, compat.MAMBA_SPLIT, "kv_holding_waiting or skipped_waiting",
                 "max_num_active_reqs or max_num_running_reqs"):
        assert name in message


def test_a_schedule_that_only_delegates_keeps_the_bases_hook():
    class Delegating(Scheduler):
        def schedule(self, throttle_prefills: bool = False):
            return super().schedule(throttle_prefills)

    assert compat.detect_surface(Delegating).cap_hook == compat.detect_surface(
        Scheduler).cap_hook


def test_request_fields_are_all_found_and_a_missing_one_is_named():
    from vllm.v1.request import Request

    compat.check_request_fields(Request)

    class NotARequest:
        def __init__(self):
            self.request_id = "x"

    with pytest.raises(compat.UnsupportedVllmError, match="is_prefill_chunk"):
        compat.check_request_fields(NotARequest)


def test_an_older_release_is_refused_naming_the_range():
    with pytest.raises(compat.UnsupportedVllmError, match=r">=0\.23,<0\.35; the installed "
                       r"vLLM is 0\.22\.1\."):
        compat.check_vllm_version("0.22.1", environ={})


@pytest.mark.parametrize("version", ["0.23.0", "0.27.1", "0.30.0", "0.32.0", "0.33.0",
                                     "0.34.0", "0.34.1", "0.30.0rc2"])
def test_tested_releases_pass(version):
    assert compat.check_vllm_version(version, environ={}) is False


@pytest.mark.parametrize("version", ["0.35.0", "0.35.0rc1", "1.0.0"])
def test_a_newer_release_is_untested_unless_strict_refuses_it(version):
    assert compat.check_vllm_version(version, environ={}) is True
    assert compat.check_vllm_version(version, environ={compat.STRICT_VLLM_ENV: "0"}) is True
    with pytest.raises(compat.UnsupportedVllmError,
                       match=rf"{version}; FAIRSCHED_STRICT_VLLM is set"):
        compat.check_vllm_version(version, environ={compat.STRICT_VLLM_ENV: "1"})


def test_a_newer_release_missing_a_hook_is_refused_naming_it():
    """Past the tested range start-up rests on detection: a missing hook still stops it."""
    from vllm.v1.request import Request

    class HookMoved(Scheduler):
        _preempt_request = None

    with pytest.raises(compat.UnsupportedVllmError, match="HookMoved._preempt_request is "
                       "missing"):
        compat.wire(HookMoved, Request, "0.99.0")
    base = compat.wire(Scheduler, Request, "0.99.0")
    assert base.fairsched_untested_release is True
    warning = compat.untested_release_warning("0.99.0", base.fairsched_surface)
    assert "vLLM 0.99.0 is newer" in warning and base.fairsched_surface.describe() in warning


NEWER_RELEASE_SCRIPT = """
import logging, sys
import vllm
vllm.__version__ = "0.99.0"
logging.basicConfig(level=logging.INFO)
from fairsched_plugin import FairSyncScheduler
from fairsched_plugin.sim.fake_engine import OfflineEngine, make_request, make_scheduler
engine = OfflineEngine(make_scheduler(
    FairSyncScheduler, sys.argv[1], max_num_batched_tokens=64, async_scheduling=False,
    additional_config={"fairsched": {"policy": "aging", "aging": {"alpha": 1}}}))
engine.add([make_request("long", 300, 2, 0.0), make_request("short", 20, 2, 0.1)])
steps = engine.run_until_idle()
print("served", steps, "steps; left", len(engine.scheduler.requests))
"""


def _start_on_newer_release(model_dir, strict: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    if strict is not None:
        env[compat.STRICT_VLLM_ENV] = strict
    return subprocess.run([sys.executable, "-c", NEWER_RELEASE_SCRIPT, str(model_dir)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_newer_release_starts_a_real_scheduler_with_one_warning(config_only_model):
    """vLLM reporting a version past the tested range, with every hook in place: the
    plugin's scheduler is built, serves every request, and says so once in the log."""
    run = _start_on_newer_release(config_only_model, None)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "left 0" in run.stdout, run.stdout
    # vLLM's own log handler writes to stdout on some releases, stderr on others.
    log = run.stdout + run.stderr
    warnings = [line for line in log.splitlines() if "is newer than the releases" in line]
    assert len(warnings) == 1, log[-3000:]
    assert "vLLM 0.99.0" in warnings[0] and compat.STRICT_VLLM_ENV in warnings[0]
    assert compat.detect_surface(Scheduler).describe() in warnings[0]


def test_strict_mode_refuses_a_newer_release_at_import(config_only_model):
    run = _start_on_newer_release(config_only_model, "1")
    assert run.returncode != 0
    assert "UnsupportedVllmError" in run.stderr and "0.99.0" in run.stderr, run.stderr[-3000:]
    assert "FAIRSCHED_STRICT_VLLM is set" in run.stderr
