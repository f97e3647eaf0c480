"""Every arm on every case, simulated: the ``Runs`` that ``experiment.report`` reads.

Repeats of a simulation are identical (it is deterministic), so ``repeat`` here means
workload seeds: repeat r replays the cases generated with seed + r, and the report's
spread is the workload's sampling noise, not the engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..experiment.arms import Arm
from ..experiment.run_files import slug
from ..experiment.case_files import WorkloadRequest
from .engine import SimRun, Timing, simulate
from .engine_settings import SimSettings
from .fleet import simulate_fleet
from .disagg import simulate_disagg
from .routers import DEFAULT_BANDWIDTH_GB_S, Fleet
from .run_spec import RunSpec
from .step_models import StepModel

Cases = Mapping[str, Sequence[WorkloadRequest]]


def run_matrix(
    arms: Sequence[Arm],
    cases_for_repeat: Callable[[int], Cases],
    step_model: StepModel,
    settings: SimSettings,
    *,
    repeat: int = 1,
    out_dir: Path | None = None,
    trace: bool = True,
    progress: Callable[[str], None] | None = None,
    closed_loop: bool = False,
    fleet: Fleet | None = None,
    kv_bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S,
) -> tuple[dict[str, list[dict[str, Any]]], Timing]:
    """Runs per arm (one per case and repeat) and the summed loop timing. With
    ``out_dir`` each run's trace is kept under ``out_dir/runs/ARM/rN[/CASE]`` (a fleet's
    as one file per engine there). ``fleet``: run every arm on that many engines behind
    that router (``fleet.simulate_fleet``), or disaggregated with KV links of
    ``kv_bandwidth_gb_s`` (``disagg.simulate_disagg``), instead of on one."""
    runs: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    total = Timing()
    for r in range(repeat):
        cases = cases_for_repeat(r)
        single = len(cases) == 1
        for arm in arms:
            for name, case in cases.items():
                trace_path = None
                if trace and out_dir is not None:
                    run_dir = out_dir / "runs" / slug(arm.name) / f"r{r + 1}"
                    if not single:
                        run_dir = run_dir / slug(name)
                    run_dir.mkdir(parents=True, exist_ok=True)
                    trace_path = run_dir / "trace.jsonl"
                category = None if single else name
                trace_dir = trace_path.parent if trace_path is not None else None
                spec = RunSpec(arm, case, step_model, settings, category, closed_loop)
                if fleet is not None and fleet.disaggregated:
                    result = simulate_disagg(spec, fleet, trace_dir, kv_bandwidth_gb_s)
                elif fleet is None:
                    result: SimRun = simulate(spec, trace_path)
                else:
                    result = simulate_fleet(spec, fleet.engines, fleet.router, trace_dir)
                runs[arm.name].append(result.run)
                total.add(result.timing)
                if progress is not None:
                    progress(f"[seed +{r}] {arm.name} {name}: {len(case)} requests, "
                             f"{result.timing.steps} steps, virtual {result.virtual_s:.1f} s")
    return runs, total

