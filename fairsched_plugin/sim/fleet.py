"""A simulated fleet: N engines, each vLLM's real scheduler (stock or the plugin) on its
own virtual clock, behind a router (``routers``).

The engines advance in time order as discrete events: the engine whose clock is earliest
steps next, and a request is routed as soon as no engine's next step comes before its
arrival, so every engine has stepped up to (or just past) the arrival when the router
reads their states. A routed request joins its engine at the engine's next step, as it
joins a single engine mid-step (``engine.simulate``); an idle engine's clock moves to the
arrival. One engine behind any router is exactly :func:`engine.simulate` (tested).

The run has the report's shape: every engine's request rows (each with its ``engine``),
every engine's trace records (each with its ``engine``), and ``meta.fleet``: the router
and each engine's share of the work (requests, prompt and output tokens, the prompt tokens
its prefix cache served, steps, busy time). A fleet run's trace can only be read per
engine: steps of different engines overlap in time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..experiment.case_files import WorkloadRequest
from .arrivals import Arrivals
from .engine import EngineLoop, SimRun, Timing
from .engine_settings import SimulationStalled
from .routers import EngineState, Router, make_router
from .run_spec import RunSpec
from .step_models import StepModel


def engine_state(engine: EngineLoop, work: bool = False) -> EngineState:
    """What vLLM publishes of an engine's load: its waiting and running counts and its KV
    cache usage (the plugin's held requests count as waiting, as vLLM counts them); and
    the prompt tokens of its requests no step has scheduled yet (what the plugin's
    ``fairsched:waiting_prompt_tokens`` reports; counted only with ``work``: it walks the
    queue)."""
    scheduler = engine.scheduler
    running, waiting = scheduler.get_request_counts()
    queued = (sum(r.num_prompt_tokens for r in scheduler.waiting if r.num_computed_tokens == 0)
              if work else 0)
    return EngineState(waiting, running, float(scheduler.kv_cache_manager.usage), queued)


def simulate_fleet(spec: RunSpec, num_engines: int, router: str | Router,
                   trace_dir: Path | None = None) -> SimRun:
    """Run ``spec``'s arm on every engine of a fleet of ``num_engines`` behind ``router`` (a
    name from ``routers.ROUTERS`` or a router), to completion. ``trace_dir``: where each
    engine's trace goes (``engine-<i>.jsonl``; None: no trace). Raises
    :class:`SimulationStalled` as :func:`engine.simulate` does."""
    if num_engines < 1:
        raise ValueError(f"a fleet needs at least one engine, not {num_engines}")
    if isinstance(router, str):
        router = make_router(router, num_engines, spec.settings.kv_cache_tokens)
    reads_work = getattr(router, "queue_by_work", False)
    arrivals = Arrivals(spec.case, spec.closed_loop)
    routed: dict[str, tuple[int, WorkloadRequest]] = {}

    def finished(case_id: str, at_s: float) -> None:
        engine, request = routed[case_id]
        router.finished(engine, request)
        arrivals.done(case_id, at_s)

    engines = [
        EngineLoop(spec.arm, spec.step_model, spec.settings,
                   trace_dir / f"engine-{i}.jsonl" if trace_dir is not None else None,
                   finished)
        for i in range(num_engines)
    ]

    def deliver(arrival: float) -> None:
        request = arrivals.pop_due(arrival)
        assert request is not None
        chosen = router.route(request, arrival, [engine_state(e, reads_work) for e in engines])
        routed[request.id] = (chosen, request)
        engine = engines[chosen]
        engine.clock.jump_to(arrival)
        engine.add(request)

    total = drive(engines, arrivals.next_time, deliver, lambda: not arrivals.exhausted)
    return SimRun(_fleet_run(engines, routed, router.name, spec.step_model, spec.category),
                  total,
                  max(e.clock.now for e in engines))


def drive(engines: Sequence[EngineLoop], next_arrival: Callable[[], float | None],
          deliver: Callable[[float], None], more_to_come: Callable[[], bool]) -> Timing:
    """Step ``engines`` in time order until none is busy and nothing is left to arrive,
    then close them (also when the run fails); returns their loops' summed timing.

    ``next_arrival``: when the next request reaches the fleet (None: none released now);
    ``deliver(t)``: route and add the request due at ``t`` (it is handled as soon as no
    busy engine's next step comes before it); ``more_to_come``: whether requests not yet
    released may still arrive (a closed loop's later turns). Raises
    :class:`SimulationStalled` when no engine can schedule anything and nothing is left
    to arrive."""
    try:
        _step_in_time_order(engines, next_arrival, deliver, more_to_come)
    finally:
        for engine in engines:
            engine.close()
    total = Timing()
    for engine in engines:
        total.add(engine.timing)
    return total


def _step_in_time_order(engines: Sequence[EngineLoop],
                        next_arrival: Callable[[], float | None],
                        deliver: Callable[[float], None],
                        more_to_come: Callable[[], bool]) -> None:
    last_step = {id(e): 0 for e in engines}
    counter = stuck = 0
    while True:
        busy = [e for e in engines if e.busy]
        next_step = min((e.clock.now for e in busy), default=None)
        arrival = next_arrival()
        if arrival is not None and (next_step is None or arrival <= next_step):
            deliver(arrival)
            stuck = 0
            continue
        if next_step is None:
            if more_to_come():  # closed loop: a turn waits on nothing running
                raise SimulationStalled("simulation stopped: a session's next turn "
                                        "follows no request in flight")
            return
        # Ties in time go to the engine that stepped least recently.
        engine = min(busy, key=lambda e: (e.clock.now, last_step[id(e)]))
        now = engine.clock.now
        later = [e.clock.now for e in busy if e.clock.now > now]
        # Where an engine that can schedule nothing waits: the next arrival, or, with
        # none released, the next step elsewhere (its end may release a turn); with
        # another engine due at the same time, it waits for that one to step, unless
        # every busy engine has had its turn since anything moved: then until the first
        # KV transfer ends (disaggregated pools wait on each other's transfers).
        wait = arrival if arrival is not None else min(later, default=None)
        if wait is None and len(later) < len(busy) - 1:
            wait = now if stuck < len(busy) else min(
                (t for e in busy if (t := e.transfer_ends_s) is not None), default=now)
        before = (now, engine.timing.steps)
        engine.step(wait)
        counter += 1
        last_step[id(engine)] = counter
        stuck = stuck + 1 if (engine.clock.now, engine.timing.steps) == before else 0
        if stuck > 2 * len(engines):
            raise SimulationStalled("simulation stopped: no engine of the fleet can "
                                    "schedule anything and nothing is left to arrive")


def _fleet_run(engines: list[EngineLoop], routed: dict[str, tuple[int, WorkloadRequest]],
               router: str, step_model: StepModel, category: str | None) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []
    joined = 0
    shares = []
    for index, engine in enumerate(engines):
        run = engine.run()
        for row in run["requests"]:
            row["engine"] = index
        for record in run["trace"]:
            record["engine"] = index
        requests += run["requests"]
        trace += run["trace"]
        joined += run["meta"]["trace_joined"]
        shares.append(engine_share(engine, run))
    requests.sort(key=lambda row: (row["arrival_s"], row["id"]))
    run = {"requests": requests, "trace": trace,
           "meta": {"start_wall": 0.0, "trace_joined": joined, "simulated": True,
                    "step_model": step_model.description,
                    "fleet": {"router": router, "engines": shares}}}
    if category is not None:
        run["category"] = category
    return run


def engine_share(engine: EngineLoop, run: dict[str, Any]) -> dict[str, Any]:
    """One engine's share of a fleet's work, from its run."""
    served = [r for r in run["requests"] if r["error"] is None]
    return {
        "requests": len(run["requests"]),
        "prompt_tokens": sum(r["prompt_tokens"] for r in served),
        "output_tokens": sum(r["output_tokens"] for r in served),
        "cached_tokens": sum(r["cached_tokens"] or 0 for r in served),
        "steps": engine.timing.steps,
        "busy_s": round(engine.busy_s, 6),
    }


def balance(run: dict[str, Any]) -> dict[str, float]:
    """How evenly a fleet run spread its work: the busiest engine's busy time and prompt
    tokens over the mean's (1.0: perfectly even); for a disaggregated fleet, within each
    pool, the less even pool's."""
    pools: dict[str, list[dict[str, Any]]] = {}
    for share in run["meta"]["fleet"]["engines"]:
        pools.setdefault(share.get("pool", ""), []).append(share)
    return {key: max(_max_over_mean([s[field] for s in shares]) for shares in pools.values())
            for key, field in (("busy_max_over_mean", "busy_s"),
                               ("prompt_max_over_mean", "prompt_tokens"))}


def _max_over_mean(values: list[float]) -> float:
    return max(values) / (sum(values) / len(values)) if sum(values) else 1.0


def fleet_runner(num_engines: int, router: str) -> Callable[[RunSpec, bool], SimRun]:
    """A ``capacity.Runner`` for a fleet: each run gets a fresh ``router``. It always runs
    to completion (a fleet has no early stop): the rows up to the last arrival are the
    same either way, since nothing later changes what happened before."""

    def run(spec: RunSpec, stop_at_last_arrival: bool) -> SimRun:
        return simulate_fleet(spec, num_engines, router)

    return run
