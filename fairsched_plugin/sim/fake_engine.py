"""Drive a real vLLM scheduler without a model: fake model-runner outputs, wall clock.

Test and benchmark machinery, not serving code: nothing the plugin serves with imports it.
The pattern of vLLM's own scheduler tests (``tests/v1/core``), kept here so the test suite,
the scheduling-overhead benchmarks and the simulator (``write_config_only_model``) share
it; the simulator's own loop on a virtual clock is :mod:`fairsched_plugin.sim.engine`.
The scheduler, KV-cache manager, request objects and ``update_from_output`` are vLLM's;
only the forward pass is replaced by "each scheduled request that finished its prefill
samples token 1".
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

_OUTPUT_HAS_INDEX = "req_id_to_index" in {f.name for f in fields(ModelRunnerOutput)}
"""vLLM before 0.34 passes each request's row index beside ``req_ids``; 0.34 dropped it."""


def model_runner_output(sampled: dict[str, list[int]],
                        kv_connector_output: Any = None) -> ModelRunnerOutput:
    """The model's output for one step: the tokens each scheduled request sampled, in the
    shape this vLLM's ``update_from_output`` reads; ``kv_connector_output``: the KV
    transfers its worker saw end (a ``KVConnectorOutput``, or None)."""
    ids = list(sampled)
    index = {"req_id_to_index": {req_id: i for i, req_id in enumerate(ids)}} if (
        _OUTPUT_HAS_INDEX) else {}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=[sampled[i] for i in ids],
                             logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
                             kv_connector_output=kv_connector_output, **index)


_CONFIG_ONLY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "tie_word_embeddings": True,
}


def write_config_only_model(directory: Path, max_model_len: int = 32768) -> Path:
    """A model directory with a config and no weights: enough for a scheduler. It declares
    at least ``max_model_len`` positions, since vLLM caps the context at what the model
    declares."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**_CONFIG_ONLY_MODEL,
              "max_position_embeddings": max(_CONFIG_ONLY_MODEL["max_position_embeddings"],
                                             max_model_len)}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def make_scheduler(
    scheduler_cls: type[Scheduler],
    model_dir: Path,
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 256,
    num_blocks: int = 10_000,
    block_size: int = 16,
    max_model_len: int = 8192,
    async_scheduling: bool = True,
    enable_prefix_caching: bool = False,
    additional_config: dict[str, Any] | None = None,
    scheduling_policy: str = "fcfs",
    long_prefill_token_threshold: int = 0,
    ngram_speculative_tokens: int = 0,
    clock: Callable[[], float] | None = None,
    enable_chunked_prefill: bool = True,
) -> Scheduler:
    """A real scheduler of ``scheduler_cls`` over a fake KV cache of ``num_blocks`` blocks.

    ``scheduling_policy`` is vLLM's (``fcfs`` or ``priority``);
    ``ngram_speculative_tokens`` turns on n-gram speculative decoding with that many
    draft tokens (no draft model is needed); ``clock`` replaces a fairsched scheduler's
    wall clock (stock vLLM's takes none)."""
    model_config = ModelConfig(
        model=str(model_dir), dtype="float32", seed=42, skip_tokenizer_init=True
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        long_prefill_token_threshold=long_prefill_token_threshold,
        enable_chunked_prefill=enable_chunked_prefill,
        async_scheduling=async_scheduling,
        is_encoder_decoder=False,
        policy=scheduling_policy,
    )
    speculative_config = None
    if ngram_speculative_tokens:
        speculative_config = SpeculativeConfig(
            method="ngram", num_speculative_tokens=ngram_speculative_tokens,
            prompt_lookup_max=3, prompt_lookup_min=2,
            target_model_config=model_config, target_parallel_config=ParallelConfig(),
        )
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=enable_prefix_caching,
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=ParallelConfig(),
        speculative_config=speculative_config,
        additional_config=additional_config or {},
    )
    # VllmConfig may turn async scheduling off for this executor; the caller decides.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
        **({} if clock is None else {"clock": clock}),
    )


_hash_ready = False


def make_request(
    request_id: str,
    prompt_tokens: int,
    max_tokens: int,
    arrival_time: float,
    *,
    block_size: int = 16,
    priority: int = 0,
    prompt_token_ids: list[int] | None = None,
    sampling_params: SamplingParams | None = None,
) -> Request:
    """A request whose output length is exactly ``max_tokens`` (EOS ignored).

    The prompt is ``prompt_tokens`` ids derived from the request id, unless
    ``prompt_token_ids`` gives them (to share a prefix between requests);
    ``sampling_params`` replaces the default ones (for structured output)."""
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    return Request(
        request_id=request_id,
        prompt_token_ids=(prompt_token_ids if prompt_token_ids is not None else
                          [(hash(request_id) + i) % 997 + 2 for i in range(prompt_tokens)]),
        sampling_params=sampling_params or SamplingParams(max_tokens=max_tokens,
                                                          ignore_eos=True),
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


@dataclass
class StepRecord:
    """What one ``schedule()`` call decided."""

    output: SchedulerOutput
    sampled: dict[str, list[int]]
    running_ids_before: list[str] = field(default_factory=list)


class OfflineEngine:
    """The engine core's loop around a scheduler, with fake model outputs.

    With ``async_scheduling`` it keeps two batches in flight like vLLM's
    ``step_with_batch_queue``: step N+1 is scheduled before N's output is applied.
    """

    def __init__(
        self, scheduler: Scheduler, *, in_flight: int | None = None, model_time_s: float = 0.0
    ) -> None:
        """``model_time_s``: how long each fake forward pass takes (a sleep), for code that
        measures step times."""
        self.scheduler = scheduler
        self.model_time_s = model_time_s
        asynchronous = scheduler.scheduler_config.async_scheduling
        self.in_flight = in_flight if in_flight is not None else (2 if asynchronous else 1)
        self._queue: deque[StepRecord] = deque()
        self.steps: list[StepRecord] = []

    def add(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.scheduler.add_request(request)

    def schedule(self) -> StepRecord:
        """One ``schedule()``; the fake output is fixed now, as the model would compute it."""
        before = [r.request_id for r in self.scheduler.running]
        output = self.scheduler.schedule()
        sampled = {
            req_id: ([] if self.scheduler.requests[req_id].is_prefill_chunk else [1])
            for req_id in output.num_scheduled_tokens
        }
        record = StepRecord(output, sampled, before)
        self._queue.append(record)
        self.steps.append(record)
        return record

    def complete_oldest(self) -> None:
        """Apply the oldest in-flight batch's output, as the engine core does."""
        record = self._queue.popleft()
        if self.model_time_s:
            time.sleep(self.model_time_s)
        sampled = {req_id: record.sampled[req_id]
                   for req_id in record.output.num_scheduled_tokens}
        self.scheduler.update_from_output(record.output, model_runner_output(sampled))

    def step(self) -> StepRecord:
        """Schedule once, then complete batches until fewer than ``in_flight`` remain."""
        record = self.schedule()
        while len(self._queue) >= self.in_flight:
            self.complete_oldest()
        return record

    def drain(self) -> None:
        while self._queue:
            self.complete_oldest()

    def run_until_idle(self, max_steps: int = 100_000) -> int:
        """Step until every request has finished; returns the number of steps taken."""
        for count in range(1, max_steps + 1):
            self.step()
            if not self.scheduler.has_unfinished_requests():
                self.drain()
                return count
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")
