"""The suite's scenarios: which requests arrive, in which relative pattern, and how long a
context the engine must accept. Each builds a case at its own rate; the suite rescales
the arrivals to each load (``experiment.traces.at_rate``).

- ``azure-conv``: the Azure LLM inference trace 2023, conversation service (packaged;
  CC-BY, Splitwise, ISCA 2024): consecutive requests from the start of the trace with
  their recorded prompt and output token counts and bursty arrivals.
- ``sharegpt``: ShareGPT conversations' first turns with Poisson arrivals (the
  ``uniform`` workload; token counts in the tiny model's tokenizer, which splits text
  into somewhat more tokens than an 8B model's).
- ``long-context``: ``azure-conv`` with one request in ``LONG_EVERY`` given a prompt of
  32k-128k tokens (log-uniform, seeded; its output as recorded), as agentic and RAG
  traffic mixes long documents into chat. ``max_model_len`` 131072.
- ``azure-code``: the same trace's code service (packaged): longer prompts (median 1,469
  tokens, up to 7,437) and short answers.
- ``mooncake-conv``: Moonshot AI's Kimi conversation trace (packaged; Apache-2.0,
  Mooncake, FAST 2025): consecutive requests from its start with their recorded lengths,
  arrivals and shared 512-token blocks, replayed open-loop with vLLM's prefix cache on
  (prompts of 12k tokens on average, up to 126k). ``max_model_len`` 131072.
  ``mooncake-conv-nocache`` replays it with the prefix cache off.
- ``chat-sessions``: ShareGPT's multi-turn conversations as sessions (``experiment.sessions``):
  each turn resends the history, the next turn follows the answer after a think time of
  3-60 s (closed loop), prefix cache on. ``chat-sessions-open`` replays the same requests
  open-loop (each turn its think time after the previous turn's arrival, answered or
  not), to show what open-loop replay gets wrong.
- ``agent``: tool-using agent sessions (``experiment.sessions.agent_sessions``): a 6k-token
  system prompt shared by all, a task context of 2k-24k tokens, then up to 40 steps that
  are almost fully cached, one in 25 adding a 20k-60k-token document; closed loop,
  prefix cache on, ``max_model_len`` 131072.

``azure-conv``, ``azure-code``, ``sharegpt`` and ``long-context`` run with the prefix
cache off: their requests record no sharing between prompts, so a cache would find
nothing. The others run with it on, as ``vllm serve`` does by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..experiment.pairs import PairPool, build_pool, read_pool, request_class, write_pool
from ..experiment.sessions import agent_sessions, chat_sessions
from ..experiment.traces import read_trace, trace_case, window
from ..experiment.case_files import WorkloadRequest
from ..experiment.workloads import build_workload
from ..model.tiny import DEFAULT_MODEL_DIR, build_tiny_model

LONG_EVERY = 40
LONG_RANGE = (32_768, 131_072)
SHAREGPT_POOL = Path(".cache/sharegpt-pool.jsonl")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    max_model_len: int
    build: Callable[[int], list[WorkloadRequest]]
    """``n`` requests at the scenario's own rate."""
    prefix_caching: bool = False
    """vLLM's prefix cache on (its default) for a scenario whose requests name their
    shared blocks; off where a trace records no sharing (every prompt would miss)."""
    closed_loop: bool = False
    """A session's next turn follows its previous answer (``sim.arrivals``); otherwise
    every request arrives at its recorded time."""


def azure_conv(n: int) -> list[WorkloadRequest]:
    return trace_case(window(read_trace("azure-conv"), n), "azure-conv")


def azure_code(n: int) -> list[WorkloadRequest]:
    return trace_case(window(read_trace("azure-code"), n), "azure-code")


def mooncake_conv(n: int) -> list[WorkloadRequest]:
    return trace_case(window(read_trace("mooncake-conv"), n), "mooncake-conv")


def long_context(n: int, seed: int = 0) -> list[WorkloadRequest]:
    """``azure_conv`` with every ``LONG_EVERY``-th request (from the middle of the first
    stride) made a long-context one; prompt + output stay within 131072."""
    rng = np.random.default_rng(seed)
    low, high = LONG_RANGE
    out = []
    for i, request in enumerate(azure_conv(n)):
        if i % LONG_EVERY == LONG_EVERY // 2:
            limit = high - request.output_tokens
            prompt = min(int(math.exp(rng.uniform(math.log(low), math.log(high)))), limit)
            request = replace(request, prompt_tokens=prompt,
                              request_class=request_class(prompt))
        out.append(replace(request, category="long-context"))
    return out


def sharegpt(n: int) -> list[WorkloadRequest]:
    """The ``uniform`` ShareGPT workload (:func:`_pool`)."""
    return build_workload("uniform", _pool(), seed=0, num_requests=n)


def _pool() -> PairPool:
    """The ShareGPT pool ``make main`` builds (built here with the tiny model's tokenizer
    when missing)."""
    if SHAREGPT_POOL.exists():
        return read_pool(SHAREGPT_POOL)
    build_tiny_model(DEFAULT_MODEL_DIR)
    pool = build_pool(DEFAULT_MODEL_DIR, None)
    SHAREGPT_POOL.parent.mkdir(parents=True, exist_ok=True)
    write_pool(SHAREGPT_POOL, pool)
    return pool


def chat(n: int) -> list[WorkloadRequest]:
    return chat_sessions(_pool().pairs, n)


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (
        Scenario("azure-conv", "Azure LLM inference trace 2023, conversation service",
                 16_384, azure_conv),
        Scenario("sharegpt", "ShareGPT first turns, Poisson arrivals", 16_384, sharegpt),
        Scenario("long-context", f"azure-conv with 1 in {LONG_EVERY} prompts of 32k-128k "
                                 "tokens", 131_072, long_context),
        Scenario("mooncake-conv", "Mooncake (Kimi) conversation trace, shared prefixes, "
                                  "prefix cache on", 131_072, mooncake_conv,
                 prefix_caching=True),
        Scenario("mooncake-conv-nocache", "mooncake-conv with the prefix cache off",
                 131_072, mooncake_conv),
        Scenario("azure-code", "Azure LLM inference trace 2023, code service", 16_384,
                 azure_code),
        Scenario("chat-sessions", "ShareGPT multi-turn sessions, closed loop, prefix cache "
                                  "on", 16_384, chat, prefix_caching=True, closed_loop=True),
        Scenario("chat-sessions-open", "chat-sessions replayed open-loop, prefix cache on",
                 16_384, chat, prefix_caching=True),
        Scenario("agent", "agent sessions over a shared context, closed loop, prefix "
                          "cache on", 131_072, agent_sessions, prefix_caching=True, closed_loop=True),
    )
}
