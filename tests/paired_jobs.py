"""Start a test module's subprocess runs two at a time, ahead of the tests that check them.

Why: the slowest modules (vLLM's own scheduler tests on each release, the project's
scheduler tests over each older release) spend their minutes waiting on subprocesses that
each keep about one core busy, one after another, while CI has two cores. Here the runs
the selected tests need start in test order on :data:`WORKERS` threads; each test still
waits for and checks its own run, so a failure is reported where it was before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import pytest

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

WORKERS = max(1, min(2, os.cpu_count() or 1))
"""Runs at a time: two on CI's two cores (each run is a single busy interpreter)."""


class PairedJobs(Generic[K, T]):
    """``job(key)`` for each key asked for, at most :data:`WORKERS` at a time, each once."""

    def __init__(self, job: Callable[[K], T]) -> None:
        self._job = job
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[K, Future[T]] = {}

    def start(self, keys: Iterable[K]) -> None:
        """Queue the runs of ``keys`` not queued yet, in this order."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="paired")
        for key in keys:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._job, key)

    def result(self, key: K) -> T:
        """The run of ``key`` (started now if no one queued it), once it has finished."""
        self.start([key])
        return self._futures[key].result()

    def close(self) -> None:
        """Drop the queued runs no test is waiting for; the running ones end on their own
        time limits."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._futures.clear()


def selected(request: pytest.FixtureRequest) -> list[pytest.Item]:
    """The session's selected test items of the requesting module, in run order."""
    return [item for item in request.session.items if item.module is request.module]
