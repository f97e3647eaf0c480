"""FLOPs and bytes of one engine step of a decoder-only transformer, and its time on an
accelerator by a per-operation roofline.

Per layer, with hidden h, heads n_h, KV heads n_kv, head dim d, intermediate I and T tokens
in the step (prefill chunks plus decode tokens):

- projections and gated MLP: ``2 T (h (n_h + 2 n_kv) d + n_h d h + 3 h I)`` FLOPs, reading
  every weight once (``(h (n_h + 2 n_kv) d + n_h d h + 3 h I)`` parameters) plus the
  activations in and out of each matrix product;
- attention: a sequence computing q new tokens after p cached ones does
  ``sum_{i=1..q} (p + i) = q p + q (q + 1) / 2`` query-key pairs, each ``2 d`` FLOPs for the
  scores and ``2 d`` for the weighted values, per head; it reads the K and V of all
  ``p + q`` tokens (``2 n_kv d`` values each);
- the element-wise operations between them (two RMSNorms, rotary embedding of q and k,
  the SiLU-and-multiply, two residual adds), memory-bound: ``T (10 h + 2 (n_h + n_kv) d +
  3 I)`` elements read or written;
- once per step, the LM head: ``2 h V`` FLOPs per sequence in the batch (vLLM computes
  logits for each scheduled sequence's last token) and its ``h V`` weights.

Time = the element-wise bytes over the effective bandwidth plus, summed over the three
other parts, of ``max(FLOPs / (peak x efficiency), bytes / (bandwidth x
efficiency))``, plus the accelerator's fixed per-step overhead. A roofline per part, not one
for the whole step: a decode batch is bandwidth-bound in the weights while its attention
can be bound by the KV reads, and summing them is closer to sequential kernels than one max.
"""

from __future__ import annotations

from dataclasses import dataclass

from .batch import SimBatch
from .hardware import Accelerator, TransformerConfig


@dataclass(frozen=True)
class StepCost:
    """Work of one step: FLOPs and bytes per part (all layers summed)."""

    linear_flops: float
    linear_bytes: float
    elementwise_bytes: float
    attention_flops: float
    attention_bytes: float
    head_flops: float
    head_bytes: float


def linear_params_per_layer(cfg: TransformerConfig) -> int:
    """Parameters of one layer's projections and gated MLP (norms left out: negligible)."""
    h, d = cfg.hidden_size, cfg.head_dim
    qkv = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    out = cfg.num_heads * d * h
    mlp = 3 * h * cfg.intermediate_size
    return qkv + out + mlp


def linear_activation_elements(cfg: TransformerConfig) -> int:
    """Elements read and written per token by one layer's matrix products."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qkv = h + (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    out = cfg.num_heads * d + h
    mlp = (h + 2 * i) + (i + h)
    return qkv + out + mlp


def elementwise_elements(cfg: TransformerConfig) -> int:
    """Elements one layer's element-wise operations read and write per token."""
    h, d = cfg.hidden_size, cfg.head_dim
    return 10 * h + 2 * (cfg.num_heads + cfg.num_kv_heads) * d + 3 * cfg.intermediate_size


def attention_pairs(batch: SimBatch) -> int:
    """Query-key pairs of the step (causal): q p + q (q + 1) / 2 per sequence."""
    pairs = 0
    for chunk, processed in batch.prefills:
        pairs += chunk * processed + chunk * (chunk + 1) // 2
    for context, tokens in batch.decodes:
        pairs += tokens * context + tokens * (tokens + 1) // 2
    return pairs


def attention_tokens_read(batch: SimBatch) -> int:
    """Tokens whose K and V the step's attention reads (context plus new, per sequence)."""
    return (sum(chunk + processed for chunk, processed in batch.prefills)
            + sum(context + tokens for context, tokens in batch.decodes))


def step_cost(cfg: TransformerConfig, batch: SimBatch) -> StepCost:
    """The step's FLOPs and bytes (module docstring)."""
    b = cfg.bytes_per_param
    tokens = batch.prefill_tokens + batch.decode_tokens
    layers = cfg.num_layers
    params = linear_params_per_layer(cfg)
    head_params = cfg.hidden_size * cfg.vocab_size
    return StepCost(
        linear_flops=2.0 * tokens * params * layers,
        linear_bytes=float(layers * (params + tokens * linear_activation_elements(cfg)) * b),
        elementwise_bytes=float(layers * tokens * elementwise_elements(cfg) * b),
        attention_flops=4.0 * cfg.num_heads * cfg.head_dim * attention_pairs(batch) * layers,
        attention_bytes=float(layers * 2 * cfg.num_kv_heads * cfg.head_dim * b
                              * attention_tokens_read(batch)),
        head_flops=2.0 * cfg.hidden_size * cfg.vocab_size * batch.num_requests,
        head_bytes=float(head_params * b),
    )


def roofline(flops: float, nbytes: float, acc: Accelerator, compute_efficiency: float) -> float:
    """Seconds for one kernel-like part: the slower of its compute and its memory traffic."""
    return max(flops / (acc.peak_flops * compute_efficiency),
               nbytes / (acc.bandwidth * acc.bandwidth_efficiency))


def step_time_s(cfg: TransformerConfig, acc: Accelerator, batch: SimBatch) -> float:
    """Modelled seconds of one engine step (0 work still costs the overhead)."""
    cost = step_cost(cfg, batch)
    return (roofline(cost.linear_flops, cost.linear_bytes, acc, acc.gemm_efficiency)
            + cost.elementwise_bytes / (acc.bandwidth * acc.bandwidth_efficiency)
            + roofline(cost.attention_flops, cost.attention_bytes, acc,
                       acc.attention_efficiency)
            + roofline(cost.head_flops, cost.head_bytes, acc, acc.gemm_efficiency)
            + acc.step_overhead_s)


def layer_dense_time_s(cfg: TransformerConfig, acc: Accelerator, tokens: int) -> float:
    """One layer's modelled time outside attention for ``tokens`` tokens: what Vidur's
    ``mlp.csv`` profiles (projections, MLP, norms, rotary, activation, add)."""
    cost = step_cost(cfg, SimBatch(prefills=[(tokens, 0)]))
    layers = cfg.num_layers
    return (roofline(cost.linear_flops / layers, cost.linear_bytes / layers, acc,
                     acc.gemm_efficiency)
            + cost.elementwise_bytes / layers / (acc.bandwidth * acc.bandwidth_efficiency))


def weight_bytes(cfg: TransformerConfig) -> float:
    """The model's weights (layers, LM head and, untied, the embedding)."""
    head = cfg.hidden_size * cfg.vocab_size * (1 if cfg.tie_word_embeddings else 2)
    return float((cfg.num_layers * linear_params_per_layer(cfg) + head) * cfg.bytes_per_param)


def kv_cache_tokens(cfg: TransformerConfig, acc: Accelerator,
                    memory_utilization: float = 0.9, activation_reserve: float = 0.05) -> int:
    """Tokens of KV cache vLLM would allocate: ``memory_utilization`` of the device, less
    the weights and a reserve for activations, divided by the KV bytes per token."""
    free = acc.memory_bytes * (memory_utilization - activation_reserve) - weight_bytes(cfg)
    if free <= 0:
        raise ValueError(f"{cfg.name} ({weight_bytes(cfg) / 1e9:.1f} GB of weights) does not "
                         f"fit on {acc.name} ({acc.memory_bytes / 1e9:.0f} GB)")
    return int(free // cfg.kv_bytes_per_token)
