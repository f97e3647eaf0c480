"""Build the scheduler an arm runs: vLLM's stock scheduler or the plugin's
``FairScheduler``, sync or async as vLLM would run them, unchanged, over a KV cache sized
like the simulated device's. Only the construction is the simulator's; the classes are
the real ones.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from .fake_engine import write_config_only_model
from ..experiment.arms import STOCK, Arm
from ..config import KEYS
from .clock import VirtualClock
from .engine_settings import SimSettings

_MODEL_DIRS: dict[int, Path] = {}


class KvTransfer(NamedTuple):
    """An engine's side of a disaggregated pair: ``kv_producer`` (prefill) or
    ``kv_consumer`` (decode), and the decode engine's link in GB/s."""

    role: str
    bandwidth_gb_s: float

    def config(self, settings: SimSettings) -> KVTransferConfig:
        """The ``--kv-transfer-config`` of the simulator's connector for this side."""
        from . import kv_transfer

        return KVTransferConfig(
            kv_connector=kv_transfer.CONNECTOR, kv_role=self.role,
            kv_connector_module_path=kv_transfer.MODULE,
            kv_connector_extra_config={"bandwidth_gb_s": self.bandwidth_gb_s,
                                       "kv_bytes_per_token": settings.kv_bytes_per_token})


def _model_dir(max_model_len: int) -> Path:
    """A config-only model directory (vLLM's ModelConfig needs one; no weights are read)
    that declares at least ``max_model_len`` positions."""
    if max_model_len not in _MODEL_DIRS:
        _MODEL_DIRS[max_model_len] = write_config_only_model(
            Path(tempfile.mkdtemp(prefix="fairsched-sim-")), max_model_len)
    return _MODEL_DIRS[max_model_len]


def arm_additional_config(arm: Arm, trace_path: Path | None) -> dict[str, Any]:
    """The arm's ``FAIRSCHED_*`` settings as ``--additional-config`` (so the scheduler
    reads the arm, not this process's environment, as a server started per arm would);
    string values are coerced and validated by the plugin's own config loader."""
    by_env = {key.env_name: key.path for key in KEYS}
    section: dict[str, Any] = {}
    for name, value in arm.env.items():
        path = by_env.get(name)
        if path is None:
            continue
        node = section
        *parents, leaf = path.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = _typed(value)
    if trace_path is not None and "trace_path" not in section:
        section["trace_path"] = str(trace_path)
    if section.get("trace_path") == "":
        del section["trace_path"]
    return {"fairsched": section}


def _typed(text: str) -> Any:
    """``"1.5"`` -> 1.5, ``"true"`` -> True, anything else as given: the printed
    ``--additional-config`` reads like JSON a person wrote (the loader accepts both)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def make_arm_scheduler(
    arm: Arm, settings: SimSettings, clock: VirtualClock, trace_path: Path | None,
    detected: dict[str, str] | None = None, kv_transfer: KvTransfer | None = None,
) -> Scheduler:
    """The scheduler for ``arm``: stock vLLM's (``AsyncScheduler`` with async scheduling),
    or the plugin's ``FairScheduler`` (which follows the mode) with the arm's config and
    the virtual clock. ``detected``: the ``predictor.model`` and ``predictor.device`` the
    built-in latency model would detect on the simulated engine, unless the arm sets them
    (the scheduler's own detection would find this process's CPU and a config-only model)."""
    plugin = arm.name != STOCK
    additional = arm_additional_config(arm, trace_path) if plugin else {}
    if plugin and detected:
        predictor = additional["fairsched"].setdefault("predictor", {})
        for key, value in detected.items():
            predictor.setdefault(key, value)
    if plugin:
        # No server reads a simulated engine's metrics snapshot, and virtual seconds
        # would have it rewritten many times per wall second.
        additional["fairsched"].setdefault("metrics", {})["enabled"] = False
    model_config = ModelConfig(model=str(_model_dir(settings.max_model_len)), dtype="float32",
                               seed=0, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=settings.async_scheduling,
        is_encoder_decoder=False,
        long_prefill_token_threshold=settings.long_prefill_token_threshold,
    )
    cache_config = CacheConfig(block_size=settings.block_size, gpu_memory_utilization=0.9,
                               cache_dtype="auto",
                               enable_prefix_caching=settings.enable_prefix_caching)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, parallel_config=ParallelConfig(),
                             additional_config=additional,
                             kv_transfer_config=(kv_transfer.config(settings)
                                                 if kv_transfer is not None else None))
    vllm_config.scheduler_config.async_scheduling = settings.async_scheduling
    # One layer whose page holds a block's K and V of the whole model: float32 elements,
    # head_size chosen so page bytes = block_size x kv_bytes_per_token.
    head_size = max(settings.kv_bytes_per_token // (2 * 4), 1)
    kv_cache_config = KVCacheConfig(
        num_blocks=settings.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=settings.block_size, num_kv_heads=1, head_size=head_size,
            dtype=torch.float32))],
    )
    cache_config.num_gpu_blocks = settings.num_blocks
    kwargs: dict[str, Any] = dict(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=settings.block_size, log_stats=False,
    )
    if not plugin:
        return (AsyncScheduler if settings.async_scheduling else Scheduler)(**kwargs)
    from ..adapter.scheduler import FairScheduler

    return FairScheduler(**kwargs, clock=clock)
