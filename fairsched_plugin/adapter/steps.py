"""Per-step measurement: the batch time of every engine step, for the trace and listeners.

A record is completed when the step's output comes back, so it carries the measured batch
time; it then goes to the JSON Lines trace (if one is configured) and to the listeners
(the automatic Aging alpha). Under async scheduling two batches are in flight and ``update_from_output(N)`` runs
after ``schedule(N+1)``; the time step N spent on the device is therefore taken as
``t_update(N) - max(t_dispatch(N), t_update(N-1))``: from when it was dispatched or the
previous batch finished, whichever is later, to when its output arrived. In sync mode the
second term never wins and this is plain dispatch-to-output time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from vllm.v1.core.sched.output import SchedulerOutput


StepListener = Callable[[dict[str, Any]], None]


class StepMonitor:
    """Collects a record at dispatch, completes it when the output returns, hands it on."""

    def __init__(
        self,
        trace_path: str | Path | None,
        listeners: list[StepListener],
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock``: one clock for record times and step durations (the simulator's
        virtual clock); None reads the wall clock and ``time.monotonic``."""
        self._wall: Callable[[], float] = clock or time.time
        self._mono: Callable[[], float] = clock or time.monotonic
        self._file: TextIO | None = None
        if trace_path:
            path = Path(trace_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: a server stopped by a signal still leaves every finished step.
            self._file = open(path, "w", buffering=1)
        self._listeners = listeners
        self._pending: dict[int, dict[str, Any]] = {}
        self._last_update: float = 0.0
        self._step = 0

    def on_dispatch(
        self,
        output: SchedulerOutput,
        prefill_chunks: list[int],
        finished_prefill_ids: list[str],
        admitted_ids: list[str],
        num_running: int,
        num_waiting: int,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Called at the end of ``schedule()``: ``prefill_chunks`` are the tokens of each
        prefill this step, ``finished_prefill_ids`` complete their prompt in it,
        ``admitted_ids`` left the waiting queue for it; ``extra`` fields go into the
        record as they are. What is known now is kept as it is and becomes a record in
        :meth:`on_output`: ``schedule()`` is on the path to the next batch, and only
        complete records are read."""
        if output.total_num_scheduled_tokens == 0:
            return
        self._step += 1
        self._pending[id(output)] = (
            self._step, self._wall(), self._mono(), len(output.num_scheduled_tokens),
            output.total_num_scheduled_tokens, prefill_chunks, finished_prefill_ids,
            admitted_ids, num_running, num_waiting, extra,
        )

    def on_output(self, output: SchedulerOutput) -> None:
        """Called on entry to ``update_from_output`` for the same output object."""
        now = self._mono()
        pending = self._pending.pop(id(output), None)
        if pending is not None:
            (step, t, dispatched, num_scheduled, total_tokens, chunks, finished, admitted,
             num_running, num_waiting, extra) = pending
            prefill_tokens = sum(chunks)
            record = {
                "step": step,
                "t": t,
                "num_decodes": num_scheduled - len(chunks),
                "decode_tokens": total_tokens - prefill_tokens,
                "num_prefills": len(chunks),
                "prefill_tokens": prefill_tokens,
                "prefill_chunks": chunks,
                "prefill_done": finished,
                "admitted": admitted,
                "num_running": num_running,
                "num_waiting": num_waiting,
                **(extra or {}),
                "step_time_s": now - max(dispatched, self._last_update),
                "t_done": self._wall(),
            }
            for listener in self._listeners:
                listener(record)
            if self._file is not None:
                self._file.write(json.dumps(record) + "\n")
        self._last_update = now

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
