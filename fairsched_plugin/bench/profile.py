"""``fairsched profile``: collect the latency predictor's samples from a real server.

The chunked-prefill paper (section 3.2.1 item 3) profiles the token-budget scheduler "under diverse
arrival rates, prompt-length mixtures, and concurrency levels". One server runs the plugin's
``fcfs`` policy (vLLM's decode-first token-budget rule, arrival order) with
``profile.path`` set, so the scheduler appends every step's raw features and measured
batch latency to the CSV. The driver replays a cycle of phases, each a small case of one
workload (its own prompt-length mix and arrival pattern, from light single requests to
bursts that fill the budget), and each round of the cycle runs at another rate multiplier
(x1, x0.5, x2) for more concurrency levels. It stops after the phase during which the file
reached ``--samples`` rows, so it may overshoot by one phase.

An existing file of the same memory provider is resumed: its rows count towards
``--samples``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from ..cli_types import positive_float, positive_int
from ..config import MEMORY_PROVIDERS
from ..predictor.profiling import check_resumable, read_profile
from ..user_files import output_file
from .server import add_engine_limit_arguments

if TYPE_CHECKING:
    from ..experiment.case_files import WorkloadRequest
    from ..experiment.pairs import PairPool


@dataclass(frozen=True)
class Phase:
    """One workload at ``rate`` x its default arrival rates (before the round's multiplier
    and ``--rate-scale``)."""

    workload: str
    rate: float


PHASES: tuple[Phase, ...] = (
    Phase("low_load", 2.0),               # one or two requests at a time: small decode batches
    Phase("steady_short", 1.0),           # many short prompts: wide decode batches
    Phase("steady_mixed", 1.0),
    Phase("bursty_conversational", 1.0),  # bursts: sudden concurrency
    Phase("bursty_long", 2.0),            # long prompts: budget-filling prefill chunks
    Phase("short_long_mix", 1.0),
    Phase("flash_crowd", 2.0),
    Phase("uniform", 3.0),                # more than the engine keeps up with: queueing
)
ROUND_RATES = (1.0, 0.5, 2.0)


def phase_plan() -> Iterator[tuple[int, Phase, float]]:
    """(round, phase, rate multiplier) forever: every phase once per round."""
    for round_index in itertools.count():
        for phase in PHASES:
            yield round_index, phase, phase.rate * ROUND_RATES[round_index % len(ROUND_RATES)]


class RowCounter:
    """Rows of a growing CSV (lines after the header), reading only what was appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._lines = 0

    def count(self) -> int:
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as file:
            file.seek(self._offset)
            chunk = file.read()
        # Only complete lines: the writer may be in the middle of one.
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        self._lines += complete.count(b"\n")
        return max(self._lines - 1, 0)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    # The server, replay and model-building code loads only when the command runs.
    from ..model.tiny import DEFAULT_MODEL_DIR
    from ..experiment.workload_cli import add_pool_arguments

    profile = subparsers.add_parser(
        "profile",
        help="drive a server through varied traffic and record per-step latency samples",
        description="Starts a vLLM server with the fcfs policy (vLLM's own order) and "
                    "profile.path set, replays a cycle of phases (prompt-length mixes and "
                    "arrival patterns from single requests to bursts, at x1, x0.5 and x2 "
                    "rates) until the file has --samples rows (it may overshoot by one "
                    "phase), and stops it. Each row is one step's features and measured "
                    "time, what 'fairsched train' fits the latency predictor to. An "
                    "existing profile of the same memory provider is resumed.")
    profile.add_argument("--out", type=Path, required=True,
                         help="the profile CSV (resumed if it exists)")
    profile.add_argument("--samples", type=positive_int, required=True, help="steps to record")
    profile.add_argument("--memory", choices=MEMORY_PROVIDERS, default="auto",
                         help="memory-feature provider (profile.memory)")
    profile.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                         help="model to serve (the tiny model is built here if missing)")
    profile.add_argument("--pool", type=Path,
                         help="ShareGPT pair pool (JSONL); built from --model-dir and saved "
                              "here if missing")
    profile.add_argument("--phase-requests", type=positive_int, default=32,
                         help="requests per phase")
    profile.add_argument("--rate-scale", type=positive_float, default=1.0,
                         help="multiply every phase's arrival rate (faster hardware: > 1)")
    profile.add_argument("--max-prompt-tokens", type=positive_int, default=2048,
                         help="draw no pair with a longer prompt")
    profile.add_argument("--max-output-tokens", type=positive_int, default=128,
                         help="draw no pair with a longer response")
    profile.add_argument("--seed", type=int, default=0, help="seed of the phases' traffic")
    add_engine_limit_arguments(profile)
    profile.add_argument("--dtype", default="float32",
                         help="vLLM's model dtype (--dtype); float32 suits the CPU engine")
    profile.add_argument("--engine-arg", action="append", default=[],
                         help="extra vLLM argument, repeatable (e.g. --engine-arg=--enforce-eager)")
    profile.add_argument("--timeout", type=positive_float, default=600.0,
                         help="per-request timeout (s)")
    add_pool_arguments(profile)
    profile.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from ..model.tiny import DEFAULT_MODEL_DIR, build_tiny_model
    from ..experiment.cases import load_pool
    from .runner import EngineSettings
    from .server import ServerError, running_server

    out = args.out.resolve()
    try:
        # The server writes the profile and its log beside it: the folder must exist.
        output_file(out)
        # An existing file the server could not append to stops its start-up: say so now.
        check_resumable(out, None if args.memory == "auto" else args.memory)
        counter = RowCounter(out)
        if counter.count() >= args.samples:
            print(f"{out} already has {counter.count()} samples (>= {args.samples}); "
                  "nothing to do")
            return 0
        if args.model_dir == DEFAULT_MODEL_DIR:
            build_tiny_model(args.model_dir)
        pool = load_pool(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = EngineSettings.from_args(args)
    env = {
        "FAIRSCHED_POLICY": "fcfs",
        "FAIRSCHED_PROFILE_PATH": str(out),
        "FAIRSCHED_PROFILE_MEMORY": args.memory,
    }
    engine_args = [*engine.args(), "--scheduler-cls", "fairsched_plugin.FairScheduler"]
    log_path = out.with_name(out.name + ".server.log")
    print(f"server log: {log_path}", flush=True)
    try:
        with running_server(str(args.model_dir), log_path, engine_args, env=env) as server:
            phases = collect(args, pool, server.base_url, server.model, counter)
        raw, _, meta = read_profile(out)
    except (ServerError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(raw)} samples (memory provider {meta['memory_provider']}) in {out} "
          f"after {phases} phases")
    return 0 if len(raw) >= args.samples else 1


def collect(
    args: argparse.Namespace, pool: PairPool, base_url: str, model: str, counter: RowCounter
) -> int:
    """Replay phases until ``counter`` reaches ``args.samples``; returns phases run.
    Raises ``RuntimeError`` when a phase adds no row (the scheduler is not profiling)."""
    from .replay import replay
    from .runner import warm_up

    done = threading.Event()
    # disable=None: a bar on a terminal, nothing in a log file.
    with tqdm(total=args.samples, desc="profile", unit="step", initial=counter.count(),
              disable=None) as bar:

        def follow() -> None:
            while not done.wait(0.5):
                bar.n = min(counter.count(), args.samples)
                bar.refresh()

        poller = threading.Thread(target=follow, daemon=True)
        poller.start()
        plan = phase_plan()
        phases = 0
        try:
            while (before := counter.count()) < args.samples:
                _, phase, rate = next(plan)
                cases = _phase_cases(args, pool, phase, rate, seed=args.seed + phases)
                if phases == 0:
                    warm_up(base_url, model, cases)
                bar.set_postfix_str(f"{phase.workload} x{rate:g}")
                replay(base_url, model, cases, timeout_s=args.timeout, show_progress=False)
                phases += 1
                if counter.count() == before:
                    raise RuntimeError(
                        f"phase {phase.workload} added no row to {counter.path}: the "
                        "scheduler is not profiling (profile.path); see the server log"
                    )
        finally:
            done.set()
            poller.join()
            bar.n = min(counter.count(), args.samples)
            bar.refresh()
    return phases


def _phase_cases(
    args: argparse.Namespace, pool: PairPool, phase: Phase, rate: float, seed: int
) -> list[WorkloadRequest]:
    from ..experiment.workloads import build_workload

    return build_workload(
        phase.workload,
        pool,
        seed=seed,
        num_requests=args.phase_requests,
        rate_scale=rate * args.rate_scale,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
    )
