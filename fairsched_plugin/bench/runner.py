"""``fairsched bench``: the same workloads against one server per arm, interleaved.

For each repeat and arm (the order reversed on odd repeats, A-B-B-A, so slow drift in the
machine hits every arm alike) it starts a server with identical engine arguments, waits
until it is ready, warms it up, replays each workload case in turn (one server start for
all of them: starting is the slow part on a CPU), saves the server's ``/metrics`` and the
scheduler's per-step trace per case, stops the server, and finally writes the report.
With ``vllm_bench`` each case is then replayed once more, by ``vllm bench serve`` (see
``vllm_client``), on the same server. With ``--base-url`` it replays against a server
someone else started instead.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import vllm_client
from ..experiment.arms import Arm
from ..experiment.run_files import join_trace, read_jsonl, slug, write_jsonl
from .replay import ReplayResult, replay
from .server import running_server



@dataclass(frozen=True)
class EngineSettings:
    """Engine arguments every arm shares."""

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 256
    max_model_len: int = 4096
    dtype: str = "float32"
    extra: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: Any) -> EngineSettings:
        """The settings of a command line with the ``--max-num-*``, ``--max-model-len``,
        ``--dtype`` and ``--engine-arg`` options (``bench`` and ``profile``)."""
        return cls(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            dtype=args.dtype,
            extra=tuple(args.engine_arg),
        )

    def args(self) -> list[str]:
        return [
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-model-len", str(self.max_model_len),
            "--dtype", self.dtype,
            *self.extra,
        ]


DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""Lets the runner reset the server's prefix cache (a development endpoint; the benchmark
servers listen on loopback only)."""


def reset_prefix_cache(base_url: str, attempts: int = 20) -> None:
    """Empty the server's prefix cache, so a replay never reuses the KV blocks of the
    warm-up or of an earlier replay of the same prompts (another load level, the other
    client): with prefix caching on (vLLM's default), a second replay of a case measured
    a fraction of the first's prefill work. vLLM refuses while blocks are still held, so
    this retries briefly."""
    request = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
    for _ in range(attempts):
        with urllib.request.urlopen(request, timeout=30) as response:
            if json.loads(response.read().decode("utf-8")).get("success"):
                return
        time.sleep(0.5)
    raise RuntimeError(f"{base_url} did not reset its prefix cache")


def fetch_metrics(base_url: str) -> str:
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
            return response.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"# /metrics unavailable: {exc}\n"


WARM_UP_REQUESTS = 64


def warm_up(base_url: str, model: str, cases: Sequence[Any]) -> None:
    """A burst of the case's own prompts before measuring: up to 64 prompts at once with
    16 output tokens each, so the fresh engine has met prefill chunks and decode batches of
    many sizes before the clock runs. (The large first-replay slowdown once blamed on a cold
    engine turned out to be the prefix cache, which :func:`reset_prefix_cache` handles; how
    much a cold engine alone costs was not measured.)"""
    step = max(len(cases) // WARM_UP_REQUESTS, 1)
    warm = list(cases)[::step][:WARM_UP_REQUESTS]
    replay(base_url, model, [_at_zero(case) for case in warm], show_progress=False)


def _at_zero(case: Any) -> Any:
    return replace(case, id=f"warmup-{case.id}", arrival_s=0.0,
                   output_tokens=min(case.output_tokens, 16))


def save_run(
    run_dir: Path,
    result: ReplayResult,
    trace: list[dict[str, Any]],
    metrics_text: str,
    category: str | None = None,
) -> dict[str, Any]:
    """Write one run's files and return it in the shape the report reads."""
    requests = [request.to_json() for request in result.requests]
    joined = join_trace(requests, trace, result.start_wall)
    write_jsonl(run_dir / "requests.jsonl", requests)
    (run_dir / "metrics.prom").write_text(metrics_text)
    run = {
        "requests": requests,
        "trace": trace,
        "meta": {"start_wall": result.start_wall, "trace_joined": joined,
                 "dir": str(run_dir)},
    }
    if category is not None:
        run["category"] = category
    return run


def arm_env(arm: Arm, trace_path: Path) -> dict[str, str]:
    """The ``FAIRSCHED_*`` variables that start ``arm``: its own, and for a plugin arm the
    per-step trace at ``trace_path``, unless the arm sets one (``fcfs:trace_path=`` writes
    none)."""
    env = dict(arm.env)
    if arm.engine_args:
        env.setdefault("FAIRSCHED_TRACE_PATH", str(trace_path.resolve()))
    return env


def run_arm(
    arm: Arm,
    model: str,
    cases: Mapping[str, Sequence[Any]],
    run_dir: Path,
    engine: EngineSettings,
    timeout_s: float,
    vllm_bench: bool = False,
) -> list[dict[str, Any]]:
    """One server start and warm-up for ``arm``, then each named case replayed in turn
    (each finishes before the next starts); one run per case, in the given order. With
    ``vllm_bench`` each replay is followed by ``vllm bench serve`` on the same case, whose
    figures the run carries as ``vllm_bench``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_path = run_dir / "trace.jsonl"
    env = {**arm_env(arm, trace_path), **DEV_MODE_ENV}
    args = [*engine.args(), *arm.engine_args]
    runs = []
    single = len(cases) == 1
    with running_server(model, run_dir / "server.log", args, env=env) as server:
        warm_up(server.base_url, server.model, next(iter(cases.values())))
        for name, case in cases.items():
            case_dir = run_dir if single else run_dir / slug(name)
            case_dir.mkdir(parents=True, exist_ok=True)
            reset_prefix_cache(server.base_url)
            mark = trace_path.stat().st_size if trace_path.exists() else 0
            result = replay(server.base_url, server.model, case, timeout_s=timeout_s)
            trace = read_jsonl(trace_path, offset=mark)
            run = save_run(case_dir, result, trace, fetch_metrics(server.base_url),
                           category=None if single else name)
            if vllm_bench:
                reset_prefix_cache(server.base_url)
                run["vllm_bench"] = vllm_client.run(
                    server.base_url, server.model, model, case, case_dir,
                    timeout_s=timeout_s * 2)
            runs.append(run)
    return runs


def run_matrix(
    arms: Sequence[Arm],
    model: str,
    cases: Mapping[str, Sequence[Any]],
    out_dir: Path,
    *,
    repeat: int,
    engine: EngineSettings,
    timeout_s: float,
    vllm_bench: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Every arm ``repeat`` times, interleaved A-B-B-A; returns runs per arm (one per
    case and repeat)."""
    runs: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    for r in range(repeat):
        order = arms if r % 2 == 0 else list(reversed(arms))
        for arm in order:
            print(f"[repeat {r + 1}/{repeat}] arm {arm.name}", flush=True)
            run_dir = out_dir / "runs" / slug(arm.name) / f"r{r + 1}"
            runs[arm.name].extend(
                run_arm(arm, model, cases, run_dir, engine, timeout_s, vllm_bench))
    return runs


def run_external(
    base_url: str, model: str, cases: Mapping[str, Sequence[Any]], out_dir: Path, *,
    label: str, repeat: int, timeout_s: float,
) -> dict[str, list[dict[str, Any]]]:
    """Replay against a server someone else runs (no trace: it is not ours to read)."""
    runs = []
    single = len(cases) == 1
    for r in range(repeat):
        for name, case in cases.items():
            run_dir = out_dir / "runs" / slug(label) / f"r{r + 1}"
            if not single:
                run_dir = run_dir / slug(name)
            run_dir.mkdir(parents=True, exist_ok=True)
            result = replay(base_url, model, case, timeout_s=timeout_s)
            runs.append(save_run(run_dir, result, [], fetch_metrics(base_url),
                                 category=None if single else name))
    return {label: runs}
