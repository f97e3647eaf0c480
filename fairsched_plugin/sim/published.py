"""The analytic presets against published vLLM measurements of an 8B model, end to end.

``benchmarks/calibrate_presets.py`` checks one layer's operator times against Vidur's
profiles; this module checks what a user sees from a whole engine step: the time per output
token of a single request (weights and KV read once per step, plus the engine's fixed cost
per step) and the time to first token of one long prompt (prefill compute, chunked at the
serve default budget). It ships because ``fairsched suite`` prints these figures beside
the presets it simulates. Each figure names its source; ``fit`` chooses an accelerator's bandwidth and
attention efficiencies and per-step overhead on that accelerator's figures by the least
mean absolute log error, which is how the H100 and A100 presets got theirs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from ..predictor.analytic import step_time_s
from ..predictor.batch import SimBatch
from ..predictor.hardware import Accelerator, accelerator, model_config

FP8_KV_POST = ("vLLM blog, 'State of FP8 KV-Cache' (2026-04-22), vLLM 0.19.1, FlashAttention 3, "
               "vllm bench serve at concurrency 1")
LAMBDA_A100 = ("LambdaLabsML/vllm-benchmark results/prompt_10/1xA100-80GB-SXM/"
               "Meta-Llama-3-8B-Instruct_tp1_len2048.json (2024-09): per-token time of the "
               "last request left running, from its inter-token latencies")
LAMBDA_H100 = ("LambdaLabsML/vllm-benchmark results/prompt_10/1xH100-80GB-SXM/"
               "Meta-Llama-3-8B-Instruct_tp1_len2048.json (2024-09), as for the A100")


@dataclass(frozen=True)
class Published:
    """One measured figure: a single request's decode step at a context (``kind``
    ``decode``, ms per output token) or its time to first token (``ttft``, ms)."""

    accelerator: str
    model: str
    kind: str
    tokens: int
    """Context tokens (decode) or prompt tokens (TTFT)."""
    ms: float
    source: str


PUBLISHED: tuple[Published, ...] = (
    # The post's fitted line: ITL = 6.44 ms + 4.37e-5 ms x context tokens (BF16 KV).
    Published("h100", "llama-3-8b", "decode", 256, 6.45, FP8_KV_POST),
    Published("h100", "llama-3-8b", "decode", 131_072, 12.17, FP8_KV_POST),
    # TTFT read off the post's figure (about +-5 %).
    Published("h100", "llama-3-8b", "ttft", 32_768, 1300.0, FP8_KV_POST + ", figure"),
    Published("h100", "llama-3-8b", "ttft", 131_072, 10_100.0, FP8_KV_POST + ", figure"),
    Published("h100", "llama-3-8b", "decode", 1_000, 7.05, LAMBDA_H100),
    Published("a100-80gb", "llama-3-8b", "decode", 1_000, 11.4, LAMBDA_A100),
)

SERVE_BUDGET = {"h100": 8192, "a100-80gb": 2048}
"""vLLM's serve default ``max_num_batched_tokens`` on each (the chunk size of a TTFT)."""


def predicted_ms(point: Published, acc: Accelerator) -> float:
    """The analytic model's figure for ``point`` on ``acc``."""
    cfg = model_config(point.model)
    if point.kind == "decode":
        return step_time_s(cfg, acc, SimBatch(decodes=[(point.tokens, 1)])) * 1e3
    budget = SERVE_BUDGET.get(point.accelerator, 2048)
    total, done = 0.0, 0
    while done < point.tokens:
        chunk = min(budget, point.tokens - done)
        total += step_time_s(cfg, acc, SimBatch(prefills=[(chunk, done)]))
        done += chunk
    return total * 1e3


def errors(acc_name: str, acc: Accelerator | None = None) -> list[tuple[Published, float]]:
    """(figure, relative error of the model) for each published figure on ``acc_name``."""
    acc = acc or accelerator(acc_name)
    return [(p, predicted_ms(p, acc) / p.ms - 1.0)
            for p in PUBLISHED if p.accelerator == acc_name]


def fit(acc_name: str, step_overhead_s: float | None = None) -> Accelerator:
    """Bandwidth efficiency, per-step overhead (unless given) and, where a TTFT figure
    constrains it, attention efficiency, on a grid, with the least mean absolute log
    error over the accelerator's published figures."""
    base = accelerator(acc_name)
    has_ttft = any(p.kind == "ttft" for p in PUBLISHED if p.accelerator == acc_name)
    attention = np.arange(0.30, 0.91, 0.05) if has_ttft else [base.attention_efficiency]
    overheads = (np.arange(0.0005, 0.0031, 0.00025) if step_overhead_s is None
                 else [step_overhead_s])
    best, best_loss = base, np.inf
    for bw, att, overhead in itertools.product(np.arange(0.60, 0.96, 0.01), attention,
                                               overheads):
        trial = replace(base, bandwidth_efficiency=round(float(bw), 2),
                        attention_efficiency=round(float(att), 2),
                        step_overhead_s=round(float(overhead), 5))
        loss = float(np.mean([abs(np.log1p(e)) for _, e in errors(acc_name, trial)]))
        if loss < best_loss:
            best, best_loss = trial, loss
    return best


def report() -> str:
    """Markdown: every published figure, the preset's prediction and its error."""
    lines = ["| accelerator | model | figure | published (ms) | preset (ms) | error | source |",
             "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(p.accelerator for p in PUBLISHED):
        acc = accelerator(name)
        for point, err in errors(name, acc):
            what = (f"decode step, 1 request, context {point.tokens:,}" if point.kind == "decode"
                    else f"TTFT, 1 request, prompt {point.tokens:,}")
            lines.append(f"| {acc.name} | {point.model} | {what} | {point.ms:g} | "
                         f"{predicted_ms(point, acc):.2f} | {err:+.1%} | {point.source} |")
    return "\n".join(lines)


if __name__ == "__main__":
    hopper = fit("h100")
    ampere = fit("a100-80gb", hopper.step_overhead_s)
    for fitted in (hopper, ampere):
        print(f"{fitted.name}: bandwidth_efficiency {fitted.bandwidth_efficiency}, "
              f"attention_efficiency {fitted.attention_efficiency}, "
              f"step_overhead_s {fitted.step_overhead_s}")
    print(report())
