"""The engine loop of one simulated run: arrivals on the virtual clock, vLLM's
``schedule()``, a modelled step time, fake outputs through ``update_from_output``.

Sync engine semantics (as the CPU engine and ``--no-async-scheduling`` run): at virtual
time t the requests that arrived by t are added, the scheduler plans a step, the step
model says it takes d, the clock moves to t + d and the step's outputs are applied; every
request that sampled a token in it sees the token at t + d. An idle engine jumps to the
next arrival.

Async semantics (``SimSettings.async_scheduling``, vLLM's default on GPUs, its engine
core's batch queue of two): while step N runs, step N + 1 is scheduled, from what had
arrived by N's start and without N's outputs; N's outputs are applied when N ends, and
N + 1 starts then.

Each request emits exactly its target output tokens (EOS ignored), so token accounting is
exact by construction and checked at the end.

The result is a run in the shape ``experiment.report`` reads (``bench.runner.save_run``, ``experiment.run_files``):
client-side times (arrival, first token, finish) are virtual times, the trace is the
plugin's own step monitor's (or, for stock vLLM, the same monitor driven from here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from ..adapter.profiling import kv_state_reader
from ..adapter.request_views import has_prefill_work
from ..adapter.steps import StepMonitor
from ..experiment.arms import STOCK, Arm
from ..experiment.run_files import join_trace, read_jsonl
from ..experiment.stand_in_tokens import prompt_token_ids, token_ids
from ..experiment.case_files import WorkloadRequest
from ..predictor.memory import KvCacheMemory
from .arrivals import Arrivals
from ..predictor.batch import SimBatch
from .clock import VirtualClock
from .fake_engine import model_runner_output
from .engine_settings import SimSettings, SimulationStalled
from .run_spec import RunSpec
from .scheduler_factory import KvTransfer, make_arm_scheduler
from .step_models import AnalyticStepModel, StepModel


TOO_LONG = "prompt + output tokens exceed max_model_len"


def engine_request_id(case_id: str) -> str:
    """vLLM's id of a completion as the server forms it (``cmpl-<id>-<choice>``), so the
    trace joins to the case with the benchmark's own ``join_trace``."""
    return f"cmpl-{case_id}-0"


_hash_ready = False


def make_request(case: WorkloadRequest, block_size: int | None = None,
                 kv_transfer_params: dict[str, Any] | None = None,
                 output_tokens: int | None = None) -> Request:
    """The engine request of ``case``; with ``block_size`` (prefix caching on), its
    blocks are hashed as vLLM's engine hashes them, so its cache hits them.
    ``kv_transfer_params``: what a disaggregation proxy attaches (``kv_transfer``);
    ``output_tokens``: in place of the case's (a prefill engine's request stops at one)."""
    global _hash_ready
    hasher = None
    if block_size is not None:
        if not _hash_ready:
            init_none_hash(sha256)
            _hash_ready = True
        hasher = get_request_block_hasher(block_size, sha256)
    return Request(
        request_id=engine_request_id(case.id),
        prompt_token_ids=prompt_token_ids(case),
        sampling_params=SamplingParams(
            max_tokens=output_tokens or case.output_tokens, ignore_eos=True,
            extra_args={"kv_transfer_params": kv_transfer_params} if kv_transfer_params
            else None),
        pooling_params=None,
        arrival_time=case.arrival_s,
        block_hasher=hasher,
    )


_cpu = time.process_time
"""The loop's timings are this process's CPU seconds: on a shared machine wall time also
counts other processes, and the split between the parts would be noise."""


@dataclass
class Timing:
    """CPU time spent in each part of the loop (for ``benchmarks/``)."""

    schedule_s: float = 0.0
    update_s: float = 0.0
    step_model_s: float = 0.0
    other_s: float = 0.0
    steps: int = 0

    def add(self, part: Timing) -> None:
        """Count ``part``'s time and steps in this total."""
        self.schedule_s += part.schedule_s
        self.update_s += part.update_s
        self.step_model_s += part.step_model_s
        self.other_s += part.other_s
        self.steps += part.steps


@dataclass
class _Batch:
    """A dispatched step: what was scheduled, what each request samples, when it ends."""

    output: Any
    sampled: dict[str, list[int]]
    finish_s: float


@dataclass
class SimRun:
    """One arm on one case: the report's run dict, and what the loop measured."""

    run: dict[str, Any]
    timing: Timing
    virtual_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def _result_row(case: WorkloadRequest) -> dict[str, Any]:
    return {"id": case.id, "category": case.category, "tier": case.tier,
            "prompt_tokens": case.prompt_tokens, "target_output_tokens": case.output_tokens,
            "arrival_s": case.arrival_s, "sent_s": case.arrival_s, "first_scheduled_s": None,
            "first_token_s": None, "finish_s": None, "output_tokens": 0, "error": None,
            "cached_tokens": None, "prefill_tokens": 0,
            "class": case.request_class}


def _batch_of(scheduler: Scheduler, output: Any, rows: dict[str, dict[str, Any]]
              ) -> tuple[SimBatch, list[str]]:
    """The step's batch (per sequence) and the prefills it completes, read after
    ``schedule()`` (which has already advanced ``num_computed_tokens``); each prefill's
    tokens are added to its row's ``prefill_tokens`` (recomputation after a preemption
    included)."""
    batch = SimBatch()
    finished: list[str] = []
    for req_id, n in output.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        before = request.num_computed_tokens - n
        if has_prefill_work(request, before):
            batch.prefills.append((n, before))
            rows[req_id]["prefill_tokens"] += n
            if before + n >= request.num_tokens:
                finished.append(req_id)
        else:
            batch.decodes.append((before, n))
    return batch, finished


class EngineLoop:
    """One simulated engine: vLLM's scheduler (stock or the plugin) on its own virtual
    clock, stepped by a driver that hands it its requests (:func:`simulate` for one
    engine, ``fleet.simulate_fleet`` for several behind a router).

    A driver adds every request that has arrived by :attr:`clock`'s ``now``
    (:meth:`add`), then calls :meth:`step` while the engine is :attr:`busy`; an idle
    engine's clock is moved to its next request's arrival by the driver. ``on_finish``
    hears of each request that finished (or failed), with its case id and the time: under
    closed loop the driver releases the session's next turn then. ``kv_transfer``: the
    engine's side of a disaggregated pair (``disagg``); its connector is :attr:`kv`.
    """

    def __init__(self, arm: Arm, step_model: StepModel, settings: SimSettings,
                 trace_path: Path | None, on_finish: Callable[[str, float], None],
                 kv_transfer: KvTransfer | None = None) -> None:
        self.clock = clock = VirtualClock()
        self.settings = settings
        self.step_model = step_model
        self.trace_path = trace_path
        self.on_finish = on_finish
        # The plugin's built-in latency model detects the device it runs on: here, the
        # one simulated (an arm's predictor.model or predictor.device still wins).
        detected = ({"model": step_model.config.name, "device": step_model.device}
                    if isinstance(step_model, AnalyticStepModel) and step_model.device
                    else None)
        self.scheduler = make_arm_scheduler(arm, settings, clock, trace_path, detected,
                                            kv_transfer)
        self.kv = self.scheduler.connector if kv_transfer is not None else None
        """The simulated KV connector (``kv_transfer.SimulatedKVTransfer``), if any."""
        self.monitor = (StepMonitor(trace_path, [], clock=clock)
                        if arm.name == STOCK and trace_path is not None else None)
        self.memory = KvCacheMemory(kv_state_reader(self.scheduler))
        self.timing = Timing()
        self.busy_s = 0.0
        """Virtual seconds the device spent running steps."""
        self.rows: dict[str, dict[str, Any]] = {}
        self.case_ids: dict[str, str] = {}
        self.in_flight: _Batch | None = None
        self.cache_blocks = settings.block_size if settings.enable_prefix_caching else None
        self.answers: dict[str, WorkloadRequest] = {}
        """Session turns, whose named blocks cover their answer: they sample those tokens,
        so the next turn finds the answer cached too. Other requests' blocks name their
        prompt only (a trace's hashes): their answers are their own."""
        self._cpu_start = _cpu()

    @property
    def busy(self) -> bool:
        """A step is in flight or a request is unfinished."""
        return self.in_flight is not None or self.scheduler.has_unfinished_requests()

    @property
    def transfer_ends_s(self) -> float | None:
        """When this engine's next KV transfer ends (None: none under way)."""
        return self.kv.next_event_s() if self.kv is not None else None

    def add(self, case: WorkloadRequest, kv_transfer_params: dict[str, Any] | None = None,
            output_tokens: int | None = None) -> None:
        """``case`` reaches the engine now; one too long for ``max_model_len`` fails at
        once, as the server answers it (HTTP 400), and is never scheduled. The other
        arguments: as :func:`make_request`'s (the row's target stays the case's)."""
        req_id = engine_request_id(case.id)
        self.case_ids[req_id] = case.id
        row = self.rows[req_id] = _result_row(case)
        if case.prompt_tokens + case.output_tokens > self.settings.max_model_len:
            row["error"] = TOO_LONG
            self.on_finish(case.id, self.clock.now)
            return
        if output_tokens is not None:
            row["target_output_tokens"] = output_tokens
        self.scheduler.add_request(make_request(case, self.cache_blocks, kv_transfer_params,
                                                output_tokens))
        if case.blocks and case.session:
            self.answers[req_id] = case

    def step(self, upcoming: float | None) -> None:
        """Schedule and dispatch one step (the engine is :attr:`busy`). ``upcoming``: when
        the engine may next be handed a request (None: never), where an engine that can
        schedule nothing and has nothing in flight waits."""
        clock, scheduler, timing = self.clock, self.scheduler, self.timing
        if clock.now > self.settings.max_virtual_s:
            _stalled(scheduler, f"still unfinished at virtual time {clock.now:.1f} s "
                                f"(bound {self.settings.max_virtual_s:g} s)")
        t0 = _cpu()
        output = scheduler.schedule()
        timing.schedule_s += _cpu() - t0
        # The batch runs once the device is free: now, or when the batch in flight ends;
        # the KV loads it carries start then (an empty step carries them too).
        start = clock.now if self.in_flight is None else self.in_flight.finish_s
        if self.kv is not None:
            self.kv.start_pulls(start)
        if output.total_num_scheduled_tokens == 0:
            loaded = self.transfer_ends_s
            if self.in_flight is not None:
                self._complete(self.in_flight)
                self.in_flight = None
            elif upcoming is None and loaded is None:
                _stalled(scheduler, "nothing schedulable and nothing left to arrive")
            else:
                clock.jump_to(min(t for t in (upcoming, loaded) if t is not None))
            scheduler.update_from_output(output, model_runner_output({}, self._kv_due()))
            return
        batch, finished = _batch_of(scheduler, output, self.rows)
        if self.monitor is not None:
            self.monitor.on_dispatch(
                output, [n for n, _context in batch.prefills], finished,
                [new.req_id for new in output.scheduled_new_reqs],
                num_running=len(scheduler.running), num_waiting=len(scheduler.waiting))
        state = self.memory.read()
        t2 = _cpu()
        duration = self.step_model.step_time_s(batch, state)
        timing.step_model_s += _cpu() - t2
        timing.steps += 1
        self.busy_s += duration
        sampled = {req_id: _sampled(scheduler.requests[req_id], self.answers.get(req_id))
                   for req_id in output.num_scheduled_tokens}
        dispatched = _Batch(output, sampled, start + duration)
        for req_id, n in output.num_scheduled_tokens.items():
            row = self.rows[req_id]
            if row["first_scheduled_s"] is None:
                row["first_scheduled_s"] = start
                # What the prefix cache held of the prompt when it was admitted.
                row["cached_tokens"] = scheduler.requests[req_id].num_computed_tokens - n
        if self.in_flight is not None:
            self._complete(self.in_flight)
        if self.settings.async_scheduling:
            self.in_flight = dispatched  # the next step is scheduled while this one runs
        else:
            self.in_flight = None
            self._complete(dispatched)

    def _complete(self, batch: _Batch) -> None:
        """The batch's outputs reach the scheduler (and the clients) when it finishes."""
        self.clock.jump_to(batch.finish_s)
        if self.monitor is not None:
            self.monitor.on_output(batch.output)
        t0 = _cpu()
        engine_outputs = self.scheduler.update_from_output(
            batch.output, model_runner_output(batch.sampled, self._kv_due()))
        self.timing.update_s += _cpu() - t0
        for req_id in _record(engine_outputs, self.rows, self.clock.now):
            self.on_finish(self.case_ids[req_id], self.clock.now)

    def _kv_due(self) -> Any:
        """The KV transfers that ended by now, as the step's worker reports them."""
        return self.kv.due(self.clock.now) if self.kv is not None else None

    def close(self) -> None:
        """Shut the scheduler down and finish the trace; counts the loop's own CPU time."""
        self.scheduler.shutdown()
        if self.monitor is not None:
            self.monitor.close()
        timing = self.timing
        timing.other_s = _cpu() - self._cpu_start - (
            timing.schedule_s + timing.update_s + timing.step_model_s)

    def run(self, complete: bool = True) -> dict[str, Any]:
        """The run in the report's shape, after :meth:`close`; ``complete``: every
        request must have all its tokens (checked)."""
        requests = list(self.rows.values())
        if complete:
            _check_tokens(requests)
        trace = read_jsonl(self.trace_path) if self.trace_path is not None else []
        joined = join_trace(requests, trace, 0.0)
        return {"requests": requests, "trace": trace,
                "meta": {"start_wall": 0.0, "trace_joined": joined, "simulated": True,
                         "step_model": self.step_model.description}}


def simulate(spec: RunSpec, trace_path: Path | None = None,
             stop_at_last_arrival: bool = False) -> SimRun:
    """Run ``spec``'s arm on its case to completion on a virtual clock, or, with
    ``stop_at_last_arrival``, until the first step that starts after the last arrival
    (the requests then unfinished keep their partial rows).

    ``trace_path``: where the per-step trace goes (None: no trace). Raises
    :class:`SimulationStalled` past ``spec.settings.max_virtual_s`` or when a step schedules
    nothing while requests wait and nothing more will arrive.
    """
    arrivals = Arrivals(spec.case, spec.closed_loop)
    engine = EngineLoop(spec.arm, spec.step_model, spec.settings, trace_path, arrivals.done)
    last_arrival = -1.0
    try:
        while True:
            while (arrived := arrivals.pop_due(engine.clock.now)) is not None:
                last_arrival = arrived.arrival_s
                engine.add(arrived)
            upcoming = arrivals.next_time()
            if arrivals.exhausted and stop_at_last_arrival and engine.clock.now >= last_arrival:
                break
            if not engine.busy:
                if upcoming is None:
                    break
                engine.clock.jump_to(upcoming)
                continue
            engine.step(upcoming)
    finally:
        engine.close()
    run = engine.run(complete=not stop_at_last_arrival)
    if spec.category is not None:
        run["category"] = spec.category
    return SimRun(run, engine.timing, engine.clock.now)


def _sampled(request: Request, case: WorkloadRequest | None) -> list[int]:
    """The token a request samples in a step (none for a prefill chunk): the next of its
    answer's named tokens where it has them (``answers``), else 1."""
    if request.is_prefill_chunk:
        return []
    if case is None:
        return [1]
    return token_ids(case, request.num_computed_tokens, 1)


def _record(engine_outputs: Any, rows: dict[str, dict[str, Any]], now: float) -> list[str]:
    """What a streaming client sees at ``now``: new tokens, first token, finish. Returns
    the requests that finished."""
    finished: list[str] = []
    for outputs in engine_outputs.values():
        for out in outputs.outputs:
            row = rows.get(out.request_id)
            if row is None:
                continue
            if out.new_token_ids:
                if row["first_token_s"] is None:
                    row["first_token_s"] = now
                row["output_tokens"] += len(out.new_token_ids)
            if out.finish_reason is not None:
                row["finish_s"] = now
                finished.append(out.request_id)
    return finished


def _check_tokens(requests: list[dict[str, Any]]) -> None:
    """Every request got exactly its target tokens, first token before finish."""
    for row in requests:
        if row["error"] is not None:
            continue
        if (row["output_tokens"] != row["target_output_tokens"] or row["finish_s"] is None
                or row["first_token_s"] > row["finish_s"]):
            raise AssertionError(f"simulated request {row['id']}: {row['output_tokens']} of "
                                 f"{row['target_output_tokens']} tokens, first "
                                 f"{row['first_token_s']}, finish {row['finish_s']}")


def _stalled(scheduler: Scheduler, why: str) -> None:
    ids = sorted(scheduler.requests)
    shown = ", ".join(ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
    raise SimulationStalled(f"simulation stopped: {len(ids)} request(s) {why}: {shown}")
