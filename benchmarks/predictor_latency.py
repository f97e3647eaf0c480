"""Time the latency predictor: ONNX Runtime per call, candidate rows, and training.

Per call: ``LatencyPredictor.predict`` (one ``session.run``) on CPU with one thread for 1,
16, 64 and 256 feature rows, each call timed on its own after a warm-up; mean, P50 and P99
in microseconds. Target: P99 under 100 us at 64 rows (what LPRS scores in one step). Beside
it, ``StepRows.rows`` (building the rows LPRS scores, one candidate's chunk sizes) for the
same sizes.

Training: with ``--profile``, data preparation and ``train_model`` on that profile with one
torch thread, reported as wall time, epochs run and time per epoch.

The model is the one at ``--model``, else the one trained on ``--profile``, else an
untrained network of the default shape (inference time does not depend on the weights).
Prints figures; asserts nothing.

    .venv/bin/python benchmarks/predictor_latency.py [--model M.onnx] [--profile P.csv]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fairsched_plugin.predictor.dataset import DatasetConfig, Split, prepare
from fairsched_plugin.predictor.export import export_onnx, model_metadata
from fairsched_plugin.predictor.features import BatchStats, MemoryState, StepRows
from fairsched_plugin.predictor.profiling import read_profile
from fairsched_plugin.predictor.runtime import LatencyPredictor
from fairsched_plugin.predictor.train import TrainConfig, build_model, train_model

SIZES = (1, 16, 64, 256)


def time_calls(call: Callable[[], object], calls: int, warmup: int) -> np.ndarray:
    """Microseconds of each of ``calls`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter_ns()
        call()
        times[i] = time.perf_counter_ns() - start
    return times / 1000.0


def untrained_model(path: Path) -> Path:
    rows = np.random.default_rng(0).uniform(0, 1000, size=(64, 16)).astype(np.float32)
    split = Split(rows, rows[:, 0], np.zeros(64, np.int64), np.ones(64))
    export_onnx(build_model(split, TrainConfig()), path, model_metadata(
        memory_provider="kv_cache", vllm_version="", hardware="", training={}))
    return path


def benchmark_training(profile: list[Path], epochs: int, model_out: Path) -> None:
    raw, latency, meta = read_profile(profile)
    started = time.perf_counter()
    data = prepare(raw, latency, DatasetConfig())
    prepared = time.perf_counter() - started
    result = train_model(data.train, data.val, TrainConfig(epochs=epochs))
    print(f"training on {len(latency)} profiled steps ({data.counts['train']} train, "
          f"{data.counts['val']} validation):")
    print(f"  preparation {prepared:.2f} s; training {result.train_time_s:.1f} s for "
          f"{result.epochs_run} epochs ({result.train_time_s / result.epochs_run * 1000:.0f} "
          f"ms/epoch, best epoch {result.best_epoch}, 1 torch thread)")
    export_onnx(result.model, model_out, model_metadata(
        memory_provider=meta["memory_provider"], vllm_version="", hardware="", training={}))


def benchmark_inference(model: Path, calls: int, warmup: int) -> None:
    predictor = LatencyPredictor.load(model, threads=1)
    rng = np.random.default_rng(0)
    stats = BatchStats()
    for _ in range(20):
        stats.add_decode(int(rng.integers(10, 2000)))
    stats.add_prefill(100, processed=300)
    memory = MemoryState(500.0, 1500.0, 500.0, 2000.0)
    print(f"\nONNX Runtime {predictor.provider}, 1 thread, {calls} timed calls after "
          f"{warmup} warm-up (microseconds):\n")
    print("| rows | predict mean | P50 | P99 | StepRows.rows mean | P50 | P99 |")
    print("|---|---|---|---|---|---|---|")
    for n in SIZES:
        chunks = np.linspace(1, 256, n).astype(np.int64)
        step_rows = StepRows(stats, memory)
        candidates = [(0, 0, chunks)]
        rows = step_rows.rows(stats, candidates)
        run = time_calls(lambda: predictor.predict(rows), calls, warmup)
        build = time_calls(lambda: step_rows.rows(stats, candidates), calls, warmup)
        print(f"| {n} | {run.mean():.1f} | {np.percentile(run, 50):.1f} | "
              f"{np.percentile(run, 99):.1f} | {build.mean():.1f} | "
              f"{np.percentile(build, 50):.1f} | {np.percentile(build, 99):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="an exported model to time")
    parser.add_argument("--profile", type=Path, action="append",
                        help="profile CSV to time training on (repeatable)")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.profile:
            trained = Path(tmp) / "trained.onnx"
            benchmark_training(args.profile, args.epochs, trained)
            model = model or trained
        benchmark_inference(model or untrained_model(Path(tmp) / "untrained.onnx"),
                            args.calls, args.warmup)


if __name__ == "__main__":
    main()
