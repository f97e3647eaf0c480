"""A tiny PEFT-format LoRA adapter for the project's tiny Llama model, written by hand.

Why by hand: ``peft`` is not among the project's dependencies, and an adapter is only two
files: ``adapter_config.json`` and ``adapter_model.safetensors`` with ``lora_A`` (rank x
in) and ``lora_B`` (out x rank) per targeted projection, under PEFT's key names. vLLM loads
it with ``--enable-lora --lora-modules NAME=PATH`` and serves it as model ``NAME``.
``lora_B`` is not zero (PEFT initialises it to zero, which would make the adapter a no-op),
so requests through the adapter really run the LoRA kernels on different weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TARGET_MODULES = ("q_proj", "v_proj")


def write_lora_adapter(model_dir: Path, out_dir: Path, rank: int = 8, seed: int = 0) -> Path:
    """Write an adapter of ``rank`` on q_proj and v_proj of every layer of the model in
    ``model_dir`` (read from its config.json) into ``out_dir``; returns ``out_dir``."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    out_features = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "v_proj": config["num_key_value_heads"] * head_dim,
    }
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(config["num_hidden_layers"]):
        for module in TARGET_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(rank, hidden, generator=generator) * 0.02
            ).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_features[module], rank, generator=generator) * 0.02
            ).contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }, indent=2))
    return out_dir
