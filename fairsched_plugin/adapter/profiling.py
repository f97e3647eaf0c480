"""Per-step profiling for the latency predictor: the batch's raw features at dispatch, the
measured batch time when its output returns, one CSV row per step.

The features come from ``predictor.features`` (the one definition training and serving
use); the step time is the :class:`StepMonitor`'s, which is right under async scheduling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import ProfileConfig
from ..predictor.features import BatchStats, raw_vector
from ..predictor.memory import MemoryProvider, make_memory_provider
from ..predictor.profiling import ProfileWriter

logger = logging.getLogger("vllm.fairsched")

FEATURES_FIELD = "batch_features"
"""The step record's field holding the 11 raw features (also written to the trace)."""


def kv_state_reader(scheduler: Any) -> Callable[[], tuple[int, int, int]]:
    """The KV-cache memory provider's source: used and free blocks of the scheduler's
    block pool, and the bytes one block takes over all layers."""
    pool = scheduler.kv_cache_manager.block_pool
    bytes_per_block = sum(
        group.kv_cache_spec.page_size_bytes * len(group.layer_names)
        for group in scheduler.kv_cache_config.kv_cache_groups
    )

    def kv_state() -> tuple[int, int, int]:
        free = pool.get_num_free_blocks()
        return pool.num_gpu_blocks - free, free, bytes_per_block

    return kv_state


class StepProfiler:
    """Builds each step's features and writes them with the measured time."""

    def __init__(self, writer: ProfileWriter, memory: MemoryProvider) -> None:
        self.writer = writer
        self.memory = memory

    @classmethod
    def for_scheduler(cls, scheduler: Any, config: ProfileConfig, vllm_config: Any,
                      path: str) -> StepProfiler:
        """Rows to ``path`` (``config.path``, suffixed per engine core under data
        parallelism). Memory from the configured provider; the KV-cache one reads the
        scheduler's block pool (used and free blocks times the bytes a block takes over
        all layers)."""
        memory = make_memory_provider(config.memory, kv_state_reader(scheduler))
        sched = vllm_config.scheduler_config
        writer = ProfileWriter(path, memory.name, {
            "model": vllm_config.model_config.model,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "max_num_seqs": sched.max_num_seqs,
            "block_size": scheduler.block_size,
        })
        logger.info("fairsched: profiling every step to %s (memory provider %s)",
                    path, memory.name)
        return cls(writer, memory)

    def features(self, batch: BatchStats) -> dict[str, Any]:
        """The record fields for a batch just built (memory is read now, at dispatch)."""
        return {FEATURES_FIELD: raw_vector(batch, self.memory.read()).tolist()}

    def on_step(self, record: dict[str, Any]) -> None:
        """Step listener: one CSV row once the step's time is known."""
        self.writer.write(record["step"], np.asarray(record[FEATURES_FIELD]),
                          record["step_time_s"])

    def close(self) -> None:
        self.writer.close()
