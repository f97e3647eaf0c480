"""Accelerator and model presets for the analytic step-time model, written here (no
download), and reading a model's ``config.json``.

Accelerator figures are the vendors' published dense 16-bit tensor throughput and memory
bandwidth; where a vendor publishes only sparse or low-precision figures (RTX PRO 5000),
the dense 16-bit figure is derived from them and marked so. The efficiency factors are what
a real kernel reaches of the peak; they are the model's calibration knobs
(``docs/simulator.md`` reports how they compare with Vidur's measured operator times).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..user_files import read_text

GB = 1e9
TFLOPS = 1e12


@dataclass(frozen=True)
class Accelerator:
    """Peak 16-bit dense FLOP/s, memory bandwidth (bytes/s) and capacity (bytes); the
    fraction of each a real step reaches; and a fixed per-step cost (s) for launching the
    step, sampling and the engine's bookkeeping, which no FLOP count sees."""

    name: str
    peak_flops: float
    bandwidth: float
    memory_bytes: float
    gemm_efficiency: float = 0.71
    attention_efficiency: float = 0.45
    bandwidth_efficiency: float = 0.58
    step_overhead_s: float = 0.004
    note: str = ""
    # Defaults: gemm and bandwidth efficiencies fitted to Vidur's measured A100 Llama-3-8B
    # layer times (``calibrate``); attention efficiency and the per-step overhead are
    # estimates. Presets with published end-to-end figures override them (``published``).


ACCELERATORS: dict[str, Accelerator] = {
    "rtx4090": Accelerator("RTX 4090", 165.2 * TFLOPS, 1008 * GB, 24 * GB,
                           note="165 TFLOPS FP16 tensor, FP32 accumulate (dense); 1008 GB/s"),
    "rtxpro5000": Accelerator("RTX PRO 5000 (Blackwell, 72 GB)", 250 * TFLOPS, 1344 * GB,
                              72 * GB,
                              note="dense FP16 derived from NVIDIA's sparse FP4 AI TOPS; "
                                   "1344 GB/s"),
    # A100, H100 and H200: bandwidth and attention efficiencies and the per-step overhead
    # fitted to published vLLM figures of an 8B model (``published``; H200 takes H100's).
    "a100-80gb": Accelerator("A100 80GB SXM", 312 * TFLOPS, 2039 * GB, 80 * GB,
                             bandwidth_efficiency=0.75, step_overhead_s=0.0015,
                             note="312 TFLOPS BF16 dense; 2039 GB/s"),
    "h100": Accelerator("H100 SXM", 989 * TFLOPS, 3350 * GB, 80 * GB,
                        bandwidth_efficiency=0.90, attention_efficiency=0.60,
                        step_overhead_s=0.0015,
                        note="989 TFLOPS BF16 dense; 3.35 TB/s"),
    "h200": Accelerator("H200 SXM", 989 * TFLOPS, 4800 * GB, 141 * GB,
                        bandwidth_efficiency=0.90, attention_efficiency=0.60,
                        step_overhead_s=0.0015,
                        note="989 TFLOPS BF16 dense; 4.8 TB/s"),
    "ascend910b": Accelerator("Ascend 910B", 320 * TFLOPS, 1600 * GB, 64 * GB,
                              note="about 320 TFLOPS FP16 (910B2/B3 quoted 280-376); 1.6 TB/s "
                                   "HBM2e"),
}
ALIASES = {"4090": "rtx4090", "a100": "a100-80gb", "910b": "ascend910b",
           "rtx-pro-5000": "rtxpro5000"}


@dataclass(frozen=True)
class TransformerConfig:
    """The fields of a decoder-only transformer's ``config.json`` a step's cost depends on."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    bytes_per_param: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    """The context the model declares: ``vllm serve``'s ``--max-model-len`` by default."""

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1}
REQUIRED_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                   "intermediate_size", "vocab_size")

# The published config.json fields (Hugging Face: Qwen/Qwen3-8B, meta-llama/Meta-Llama-3-8B).
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-8b": {"num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                 "vocab_size": 151936, "torch_dtype": "bfloat16",
                 "tie_word_embeddings": False, "max_position_embeddings": 40960},
    "llama-3-8b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "intermediate_size": 14336,
                   "vocab_size": 128256, "torch_dtype": "bfloat16",
                   "tie_word_embeddings": False, "max_position_embeddings": 8192},
    "qwen3-0.6b": {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                   "vocab_size": 151936, "torch_dtype": "bfloat16",
                   "tie_word_embeddings": True, "max_position_embeddings": 40960},
    "llama-2-7b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "intermediate_size": 11008,
                   "vocab_size": 32000, "torch_dtype": "float16",
                   "tie_word_embeddings": False, "max_position_embeddings": 4096},
}
MODEL_ALIASES = {"qwen3_8b": "qwen3-8b", "llama3-8b": "llama-3-8b",
                 "meta-llama-3-8b": "llama-3-8b", "llama2-7b": "llama-2-7b"}


class PresetError(ValueError):
    """An unknown preset or an unusable config; the message names it."""


def accelerator_key(name: str) -> str:
    """The preset's key (``h100``) for a name or alias (``H100``, ``910b``)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in ACCELERATORS:
        raise PresetError(f"unknown accelerator {name!r}; presets: {', '.join(ACCELERATORS)}")
    return key


def accelerator(name: str) -> Accelerator:
    return ACCELERATORS[accelerator_key(name)]


def transformer_config(fields: dict[str, Any], name: str = "model",
                       dtype: str | None = None) -> TransformerConfig:
    """A ``config.json``'s fields -> :class:`TransformerConfig`; a missing field is an
    error naming it (a guessed layer count would make every time wrong)."""
    missing = [key for key in REQUIRED_FIELDS if key not in fields]
    if missing:
        raise PresetError(f"model config {name}: missing field(s) {', '.join(missing)} "
                          f"(needed: {', '.join(REQUIRED_FIELDS)})")
    heads = int(fields["num_attention_heads"])
    dtype = dtype or str(fields.get("torch_dtype") or fields.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise PresetError(f"model config {name}: unknown dtype {dtype!r}; "
                          f"one of {', '.join(_DTYPE_BYTES)}")
    return TransformerConfig(
        name=name,
        num_layers=int(fields["num_hidden_layers"]),
        hidden_size=int(fields["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(fields.get("num_key_value_heads", heads)),
        head_dim=int(fields.get("head_dim") or int(fields["hidden_size"]) // heads),
        intermediate_size=int(fields["intermediate_size"]),
        vocab_size=int(fields["vocab_size"]),
        bytes_per_param=_DTYPE_BYTES[dtype],
        tie_word_embeddings=bool(fields.get("tie_word_embeddings", False)),
        max_position_embeddings=(int(fields["max_position_embeddings"])
                                 if fields.get("max_position_embeddings") else None),
    )


def model_config(name_or_path: str) -> TransformerConfig:
    """A preset name, or a path to a ``config.json`` (or a directory holding one)."""
    key = MODEL_ALIASES.get(name_or_path.lower(), name_or_path.lower())
    if key in MODEL_CONFIGS:
        return transformer_config(MODEL_CONFIGS[key], key)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PresetError(f"unknown model {name_or_path!r}: not a preset "
                          f"({', '.join(MODEL_CONFIGS)}) nor a config.json path")
    try:
        fields = json.loads(read_text(path, PresetError))
    except json.JSONDecodeError as exc:
        raise PresetError(f"model config {path}: not valid JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise PresetError(f"model config {path}: not a JSON object")
    return transformer_config(fields, str(path))


def field_overrides(items: list[str], label: str) -> dict[str, float]:
    """``["field=value", ...]`` -> ``{field: value}``; a malformed item is an error naming
    ``label`` (the spec it came from)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise PresetError(f"{label}: {item!r} is not field=value")
        try:
            overrides[key] = float(value)
        except ValueError:
            raise PresetError(f"{label}: {key}={value!r} is not a number") from None
    return overrides


def with_overrides(acc: Accelerator, **values: float) -> Accelerator:
    """The preset with some fields replaced (command-line calibration)."""
    unknown = [k for k in values if k not in Accelerator.__dataclass_fields__]
    if unknown:
        raise PresetError(f"unknown accelerator field(s) {', '.join(unknown)}")
    return replace(acc, **values)
