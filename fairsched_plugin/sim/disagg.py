"""Disaggregated prefill in the simulator: a prefill pool and a decode pool, each engine
vLLM's real scheduler on its own virtual clock, the KV cache handed over through vLLM's
KV-connector hooks (``kv_transfer``), as vLLM's disaggregation proxy and NIXL do it.

A request's life, as the proxy runs it:

1. It reaches the prefill pool's router, which picks a prefill engine; that engine gets
   it with ``max_tokens=1`` and ``do_remote_decode``: it computes the prompt and samples
   one token (which the proxy drops). Its blocks stay allocated after it finishes.
2. When the prefill engine's answer comes back, the proxy sends the request, with
   ``do_remote_prefill``, to the decode engine the decode pool's router picks. vLLM's
   decode scheduler admits it as a remote load: it allocates its blocks and parks it in
   ``WAITING_FOR_REMOTE_KVS``; the next step starts the pull over the decode engine's
   link (one transfer at a time, prompt tokens x KV bytes per token / bandwidth).
3. The first step of the decode engine that ends after the pull reports it; vLLM then
   schedules the request, recomputing its last prompt token to sample its first output
   token, and decodes it to the end. The prefill engine frees its blocks at its first
   step after the pull ended.

The client's first token is the decode engine's: TTFT covers the prefill queue and
prefill, the decode engine's admission, the pull and the first decode step. Each
request's row is the decode engine's, with the client's arrival, the prefill engine's
first schedule (the queueing figure) and prefix-cache hits, ``prefill_engine``,
``engine`` (the decode engine), ``handoff_s`` (the prefill's answer) and ``kv_wait_s`` /
``kv_transfer_s`` (from the hand-off to the pull's start; the pull itself).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..experiment.arms import Arm, parse_arm
from ..experiment.case_files import WorkloadRequest
from .arrivals import Arrivals
from .engine import EngineLoop, SimRun, engine_request_id
from .fleet import drive, engine_share, engine_state
from .kv_transfer import decode_params, prefill_params
from .routers import DEFAULT_BANDWIDTH_GB_S, Fleet, make_router
from .run_spec import RunSpec
from .scheduler_factory import KvTransfer
from .step_models import StepModel

def simulate_disagg(spec: RunSpec, fleet: Fleet, trace_dir: Path | None = None,
                    bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S) -> SimRun:
    """Run ``spec``'s arm on the prefill pool of the disaggregated ``fleet`` (and on its
    decode pool, unless ``fleet.decode_arm`` names another), every engine with its settings, to
    completion. ``trace_dir``: where each engine's trace goes (``prefill-<i>.jsonl``,
    ``decode-<j>.jsonl``; None: no trace). Raises ``SimulationStalled`` as
    :func:`engine.simulate` does."""
    if not fleet.disaggregated or fleet.router is None:
        raise ValueError(f"{fleet} is not a disaggregated fleet")
    if bandwidth_gb_s <= 0:
        raise ValueError(f"the KV transfer bandwidth must be positive, not {bandwidth_gb_s}")
    arm, settings = spec.arm, spec.settings
    decode_arm = parse_arm(fleet.decode_arm) if fleet.decode_arm else arm
    prefill_router = make_router(fleet.router, fleet.engines, settings.kv_cache_tokens)
    decode_router = make_router(fleet.router, fleet.decode_engines, settings.kv_cache_tokens)
    arrivals = Arrivals(spec.case, spec.closed_loop)
    handoffs: list[tuple[float, int, WorkloadRequest]] = []
    on_prefill: dict[str, tuple[int, WorkloadRequest]] = {}
    on_decode: dict[str, int] = {}
    pulls: dict[str, tuple[float, float]] = {}
    order = itertools.count()

    def prefilled(case_id: str, at_s: float) -> None:
        index, request = on_prefill[case_id]
        prefill_router.finished(index, request)
        if prefill[index].rows[engine_request_id(case_id)]["error"] is not None:
            arrivals.done(case_id, at_s)  # refused (too long): the client hears at once
        else:
            heapq.heappush(handoffs, (at_s, next(order), request))

    def decoded(case_id: str, at_s: float) -> None:
        decode_router.finished(on_decode[case_id], on_prefill[case_id][1])
        arrivals.done(case_id, at_s)

    def pulled(case_id: str, req_id: str, start_s: float, end_s: float) -> None:
        pulls[case_id] = (start_s, end_s)
        prefill[on_prefill[case_id][0]].kv.sent(req_id, end_s)

    def engine(pool: str, i: int, run: Arm, done: Callable[[str, float], None],
               role: str) -> EngineLoop:
        trace = trace_dir / f"{pool}-{i}.jsonl" if trace_dir is not None else None
        return EngineLoop(run, spec.step_model, settings, trace, done,
                          KvTransfer(role, bandwidth_gb_s))

    prefill = [engine("prefill", i, arm, prefilled, "kv_producer")
               for i in range(fleet.engines)]
    decode = [engine("decode", j, decode_arm, decoded, "kv_consumer")
              for j in range(fleet.decode_engines)]
    for loop in decode:
        loop.kv.on_pull = (lambda req_id, start_s, end_s, loop=loop:
                           pulled(loop.case_ids[req_id], req_id, start_s, end_s))
    reads_work = getattr(prefill_router, "queue_by_work", False)

    def next_arrival() -> float | None:
        times = [t for t in (arrivals.next_time(), handoffs[0][0] if handoffs else None)
                 if t is not None]
        return min(times, default=None)

    def deliver(at_s: float) -> None:
        if handoffs and handoffs[0][0] <= at_s:
            request = heapq.heappop(handoffs)[2]
            index = decode_router.route(request, at_s,
                                        [engine_state(e, reads_work) for e in decode])
            on_decode[request.id] = index
            decode[index].clock.jump_to(at_s)
            decode[index].add(replace(request, arrival_s=at_s), decode_params())
            return
        request = arrivals.pop_due(at_s)
        assert request is not None
        index = prefill_router.route(request, at_s,
                                     [engine_state(e, reads_work) for e in prefill])
        on_prefill[request.id] = (index, request)
        prefill[index].clock.jump_to(at_s)
        prefill[index].add(request, prefill_params(), output_tokens=1)

    engines = prefill + decode
    total = drive(engines, next_arrival, deliver, lambda: not arrivals.exhausted)
    run = _disagg_run(prefill, decode, pulls, fleet, bandwidth_gb_s, spec.step_model,
                      spec.category)
    return SimRun(run, total, max(e.clock.now for e in engines))


def _disagg_run(prefill: list[EngineLoop], decode: list[EngineLoop],
                pulls: dict[str, tuple[float, float]], fleet: Fleet, bandwidth_gb_s: float,
                step_model: StepModel, category: str | None) -> dict[str, Any]:
    """The run in the report's shape: one row per client request (see the module
    docstring), every engine's trace records (with ``pool`` and ``engine``)."""
    trace: list[dict[str, Any]] = []
    joined = 0
    shares = []
    first: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for pool, loops in (("prefill", prefill), ("decode", decode)):
        for index, loop in enumerate(loops):
            run = loop.run()
            for record in run["trace"]:
                record["pool"], record["engine"] = pool, index
            trace += run["trace"]
            joined += run["meta"]["trace_joined"]
            shares.append({"pool": pool, **engine_share(loop, run)})
            for row in run["requests"]:
                if pool == "prefill":
                    row["prefill_engine"], row["engine"] = index, None
                    first[row["id"]] = row
                    if row["error"] is not None:
                        rows.append(row)
                    continue
                prefilled = first[row["id"]]
                start_s, end_s = pulls[row["id"]]
                rows.append({**row, "arrival_s": prefilled["arrival_s"],
                             "sent_s": prefilled["sent_s"],
                             "first_scheduled_s": prefilled["first_scheduled_s"],
                             "cached_tokens": prefilled["cached_tokens"],
                             "prefill_tokens": (prefilled["prefill_tokens"]
                                                + row["prefill_tokens"]),
                             "prefill_engine": prefilled["prefill_engine"], "engine": index,
                             "handoff_s": row["arrival_s"],
                             "kv_wait_s": start_s - row["arrival_s"],
                             "kv_transfer_s": end_s - start_s})
    rows.sort(key=lambda row: (row["arrival_s"], row["id"]))
    run = {"requests": rows, "trace": trace,
           "meta": {"start_wall": 0.0, "trace_joined": joined, "simulated": True,
                    "step_model": step_model.description,
                    "fleet": {"router": fleet.router, "engines": shares,
                              "disaggregated": {"prefill": fleet.engines,
                                                "decode": fleet.decode_engines,
                                                "decode_arm": fleet.decode_arm,
                                                "kv_bandwidth_gb_s": bandwidth_gb_s}}}}
    if category is not None:
        run["category"] = category
    return run


def disagg_runner(fleet: Fleet, bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S
                  ) -> Callable[[RunSpec, bool], SimRun]:
    """A ``capacity.Runner`` for a disaggregated fleet (always to completion, as
    ``fleet.fleet_runner``)."""

    def run(spec: RunSpec, stop_at_last_arrival: bool) -> SimRun:
        return simulate_disagg(spec, fleet, bandwidth_gb_s=bandwidth_gb_s)

    return run
