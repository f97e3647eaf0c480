"""The simulated engine's settings, and where each comes from.

A user who names an accelerator step model (``analytic:h100:qwen3-8b``) and no limits
must get the engine ``vllm serve`` would start on that device, not the project's CPU
engine: vLLM's token budget and sequence limit for the device (``devices``), its KV block
size, async scheduling, and the model's own context length. Any other step model (a
linear fit, an ONNX model profiled on the CPU engine) gets the CPU engine's settings, the
ones ``fairsched bench`` starts. A value given on the command line always wins, and every
run says which value came from where.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from ..cli_types import positive_int


@dataclass(frozen=True)
class SimSettings:
    """Engine settings every arm shares (the simulated ``vllm serve`` arguments), and the
    simulated KV cache: ``kv_cache_tokens`` tokens of ``kv_bytes_per_token`` bytes each
    (the bytes only shape the memory features an ONNX model reads)."""

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 256
    max_model_len: int = 4096
    block_size: int = 16
    kv_cache_tokens: int = 1 << 20
    kv_bytes_per_token: int = 4096
    enable_prefix_caching: bool = False
    async_scheduling: bool = False
    """vLLM's async engine: the next step is scheduled while one is in flight (GPUs)."""
    long_prefill_token_threshold: int = 0
    """vLLM's ``--long-prefill-token-threshold``: no request's chunk exceeds it (0: off,
    vLLM's default with one partial prefill)."""
    max_virtual_s: float = 86_400.0
    """A run still unfinished at this virtual time stops and names its unfinished requests
    (a policy that starves a request must not run forever)."""

    @property
    def num_blocks(self) -> int:
        return max(self.kv_cache_tokens // self.block_size, 1)


class SimulationStalled(RuntimeError):
    """A run that cannot finish by ``SimSettings.max_virtual_s``: the message names the
    unfinished requests."""


CPU_ENGINE: dict[str, Any] = {
    "max_num_batched_tokens": 256,
    "max_num_seqs": 256,
    "max_model_len": 4096,
    "block_size": 128,
    "async_scheduling": False,
}
"""The project's CPU engine as ``fairsched bench`` starts it (vLLM's CPU platform uses
128-token blocks and runs sync)."""

LIMITS = tuple(CPU_ENGINE)
"""The settings a user may give or leave to the device's defaults."""


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine limits of a simulated run; unset ones follow the step model's device."""
    follows = "default: vLLM's for the step model's device; the CPU engine's (%s) otherwise"
    parser.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N",
                        help="vLLM's token budget per step (" + follows % "256" + ")")
    parser.add_argument("--max-num-seqs", type=positive_int, metavar="N",
                        help="vLLM's limit on running requests (" + follows % "256" + ")")
    parser.add_argument("--max-model-len", type=positive_int, metavar="N",
                        help="vLLM's context length (default: the model's "
                             "max_position_embeddings with an accelerator step model; 4096, "
                             "the CPU engine's, otherwise)")
    parser.add_argument("--block-size", type=positive_int, metavar="N",
                        help="KV block size (" + follows % "128" + ")")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        help="vLLM's async engine: the next step is scheduled while one "
                             "runs, outputs arrive a step late (default: on with an "
                             "accelerator step model, as vLLM runs on GPUs and NPUs; off, "
                             "as the CPU engine runs, otherwise)")


def device_defaults(model: Any) -> tuple[dict[str, Any], str]:
    """The defaults for ``model``'s engine and a label naming where they come from."""
    from .devices import DEVICES, serve_defaults
    from .step_models import AnalyticStepModel

    if not isinstance(model, AnalyticStepModel) or model.device not in DEVICES:
        return dict(CPU_ENGINE), "the CPU engine's"
    serve = serve_defaults(model.device)
    values = {
        "max_num_batched_tokens": serve.max_num_batched_tokens,
        "max_num_seqs": serve.max_num_seqs,
        "max_model_len": model.config.max_position_embeddings or CPU_ENGINE["max_model_len"],
        "block_size": serve.block_size,
        "async_scheduling": serve.async_scheduling,
    }
    return values, f"vLLM's on {model.accelerator.name}"


def resolve_limits(args: argparse.Namespace, model: Any) -> tuple[dict[str, Any],
                                                                  dict[str, str]]:
    """Each limit from the command line or the device, and where each came from."""
    defaults, label = device_defaults(model)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in LIMITS:
        given = getattr(args, name, None)
        values[name] = defaults[name] if given is None else given
        sources[name] = label if given is None else "given"
    return values, sources


def describe(settings: SimSettings, sources: dict[str, str]) -> str:
    """One line per run: what the simulated engine was, and why."""
    by_source: dict[str, list[str]] = {}
    shown = {
        "max_num_batched_tokens": f"budget {settings.max_num_batched_tokens} tokens",
        "max_num_seqs": f"{settings.max_num_seqs} sequences",
        "max_model_len": f"max-model-len {settings.max_model_len}",
        "block_size": f"block {settings.block_size}",
        "async_scheduling": "async" if settings.async_scheduling else "sync",
    }
    for name, text in shown.items():
        by_source.setdefault(sources.get(name, "given"), []).append(text)
    parts = [f"{', '.join(items)} ({source})" for source, items in by_source.items()]
    kv = (f"KV cache {settings.kv_cache_tokens:,} tokens"
          f"{', prefix caching' if settings.enable_prefix_caching else ''}")
    return "engine: " + "; ".join(parts) + "; " + kv


def settings_record(settings: SimSettings, sources: dict[str, str]) -> dict[str, Any]:
    """What a run's config.json records of its engine: every setting and its source."""
    record: dict[str, Any] = {f.name: getattr(settings, f.name) for f in fields(settings)}
    record["sources"] = dict(sources)
    return record
