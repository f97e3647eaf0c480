"""pytest plugin (``-p fairsched_swap``) for vLLM's own tests, written by the fairsched
harness next to the extracted tests.

Environment (not ``FAIRSCHED_*``: the plugin rejects unknown variables of its own prefix):

* ``UPSTREAM_SWAP_MODE=plugin``: before any test module is imported (pytest loads
  ``-p`` plugins before collection), replace ``vllm.v1.core.sched.scheduler.Scheduler``
  with ``fairsched_plugin.FairSyncScheduler`` and
  ``vllm.v1.core.sched.async_scheduler.AsyncScheduler`` with a subclass of
  ``fairsched_plugin.FairScheduler`` pinned to its async variant (see ``_swap``). Every
  ``from ... import Scheduler`` that runs later (the tests,
  ``tests/v1/core/utils.create_scheduler``, the KV connector test utils,
  ``SchedulerConfig.get_scheduler_cls``) then gets the plugin's class. The plugin's classes
  were created before the swap, so they still derive from vLLM's real classes.
  ``stock`` (or unset) changes nothing.
* ``UPSTREAM_SWAP_RESULTS``: where to write ``{test id: outcome}`` as JSON, plus
  ``"__meta__"`` with each failure's message and how many schedulers of each kind were
  built (so a run whose swap silently did nothing is detected: the project test asserts
  that only plugin schedulers were built).
* ``UPSTREAM_SWAP_TIMEOUT_S``: per-test limit (SIGALRM; a scheduler that never drains
  would otherwise spin a test's ``while`` loop forever); the test fails as ``timeout``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Generator
from typing import Any

import pytest

MODE = os.environ.get("UPSTREAM_SWAP_MODE", "stock")
_outcomes: dict[str, str] = {}
_messages: dict[str, str] = {}
_built = {"plugin": 0, "stock": 0}


class FairschedTestTimeout(Exception):
    """Raised in the test's thread when it runs past UPSTREAM_SWAP_TIMEOUT_S."""


def _count_schedulers() -> None:
    """Wrap vLLM's Scheduler.__init__ (every scheduler, ours included, runs it) to count
    the schedulers built, by kind."""
    from vllm.v1.core.sched import scheduler as sched_mod

    from fairsched_plugin.adapter.scheduler import FairSchedulingMixin

    original = sched_mod.Scheduler.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _built["plugin" if isinstance(self, FairSchedulingMixin) else "stock"] += 1
        original(self, *args, **kwargs)

    sched_mod.Scheduler.__init__ = counting_init  # type: ignore[method-assign]


def _swap() -> None:
    from vllm.v1.core.sched import async_scheduler, scheduler

    from fairsched_plugin.adapter.scheduler import FairScheduler, FairSyncScheduler

    class FairAsyncScheduler(FairScheduler):
        """``FairScheduler`` that stays async, as the tests' ``AsyncScheduler`` does.

        ``FairScheduler.__new__`` builds the sync variant when the config says vLLM runs
        sync, and on the CPU platform ``VllmConfig`` turns async scheduling off even when
        the test asks for it; stock's ``AsyncScheduler`` is async regardless. Without this
        the async tests would compare stock's async scheduler with the plugin's sync one
        (``__new__`` only dispatches for ``FairScheduler`` itself, not subclasses). On a
        GPU engine, where async stays on, ``FairScheduler`` is this class.
        """

    scheduler.Scheduler = FairSyncScheduler  # type: ignore[misc]
    async_scheduler.AsyncScheduler = FairAsyncScheduler  # type: ignore[misc]


_count_schedulers()
if MODE == "plugin":
    _swap()
elif MODE != "stock":
    raise RuntimeError(f"UPSTREAM_SWAP_MODE={MODE!r}: expected 'stock' or 'plugin'")


def _on_alarm(signum: int, frame: Any) -> None:
    raise FairschedTestTimeout(
        f"test ran past UPSTREAM_SWAP_TIMEOUT_S={os.environ.get('UPSTREAM_SWAP_TIMEOUT_S')}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    limit = int(os.environ.get("UPSTREAM_SWAP_TIMEOUT_S", "0"))
    if limit > 0:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(limit)
    try:
        yield
    finally:
        if limit > 0:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return " ".join(text.split())[:400]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    test = report.nodeid
    if report.failed:
        _messages.setdefault(test, _message(report))
    if report.when == "call":
        if report.failed and "FairschedTestTimeout" in str(report.longrepr):
            _outcomes[test] = "timeout"
        else:
            _outcomes[test] = report.outcome
    elif report.when == "setup":
        if report.failed:
            _outcomes[test] = "error"
        elif report.skipped:
            _outcomes[test] = "skipped"
    elif report.when == "teardown" and report.failed and _outcomes.get(test) == "passed":
        _outcomes[test] = "error"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _outcomes[report.nodeid] = "collect-error"
        _messages[report.nodeid] = _message(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("UPSTREAM_SWAP_RESULTS")
    if path:
        data: dict[str, Any] = dict(_outcomes)
        data["__meta__"] = {"mode": MODE, "built": _built, "messages": _messages}
        with open(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
