"""Synthetic profiled steps for the predictor tests: batches built with ``BatchStats`` and
a latency that is a known function of them plus noise, so a model has something to learn
and a test knows what a good fit is."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairsched_plugin.predictor.features import BatchStats, MemoryState, raw_vector
from fairsched_plugin.predictor.profiling import ProfileWriter

NOISE_MS = 0.3


def synthetic_steps(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Raw features (n, 11) and latencies in ms (n,) of ``n`` random batches."""
    rng = np.random.default_rng(seed)
    raws, latencies = [], []
    for _ in range(n):
        stats = BatchStats()
        for _ in range(rng.integers(0, 24)):
            stats.add_decode(int(rng.integers(10, 2000)))
        for _ in range(rng.integers(0 if stats.batch_request_count else 1, 3)):
            stats.add_prefill(int(rng.integers(1, 256)), int(rng.integers(0, 1000)))
        used = float(rng.uniform(100, 1000))
        memory = MemoryState(used, 2048 - used, used, 2048)
        latency = (
            2.0 + 0.02 * stats.prefill_tokens + 0.3 * stats.decode_tokens
            + 2e-5 * stats.sum_decode_context_len
            + 1e-6 * stats.prefill_tokens * stats.prefill_processed_tokens
            + rng.normal(0.0, NOISE_MS)
        )
        raws.append(raw_vector(stats, memory))
        latencies.append(latency)
    return np.array(raws, dtype=np.float64), np.array(latencies)


def write_synthetic_profile(
    path: Path, n: int, seed: int = 0, memory_provider: str = "kv_cache"
) -> Path:
    raw, latency = synthetic_steps(n, seed)
    writer = ProfileWriter(path, memory_provider, {"source": "synthetic test data"})
    for step, (row, ms) in enumerate(zip(raw, latency)):
        writer.write(step, row, ms / 1000.0)
    writer.close()
    return path
