"""What one simulated run is given, whether on one engine, a fleet or a disaggregated one.

One object instead of the same eight parameters repeated by ``engine.simulate``,
``fleet.simulate_fleet``, ``disagg.simulate_disagg`` and every runner built on them: each
of those adds only what its kind of run needs (a trace file, a router, a fleet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..experiment.arms import Arm
from ..experiment.case_files import WorkloadRequest
from .engine_settings import SimSettings
from .step_models import StepModel


@dataclass(frozen=True)
class RunSpec:
    arm: Arm
    case: Sequence[WorkloadRequest]
    step_model: StepModel
    """The time of each step (``step_models``)."""
    settings: SimSettings
    """The engine's settings, every engine of a fleet alike."""
    category: str | None = None
    """The workload the run reports under when a matrix replays several (None: one)."""
    closed_loop: bool = False
    """A session's later turns arrive a think time after the previous turn's answer
    (``arrivals``); otherwise every request arrives as recorded."""
