"""Multi-turn sessions as cases: a conversation resends its history every turn, so its
prompts share a growing prefix that vLLM's prefix cache serves.

Each turn names its blocks (``WorkloadRequest.blocks``): block ``j`` of a session is
``<session>/<j>`` in every turn, over the prompt and the answer, so turn ``k + 1`` repeats
turn ``k``'s prompt and answer token for token and the simulator's cache hits on them as a
real one would. A turn's gap to the one before is its think time: replayed closed-loop
(``sim.arrivals``) it follows the previous answer by that long; replayed open-loop it
follows the previous turn's arrival by that long, answered or not.

- :func:`chat_sessions`: ShareGPT's conversations, turn by turn, with the token counts
  the conversation implies (turn ``k``'s prompt is turn ``k - 1``'s prompt and answer
  plus the new message, counted by the pool's tokenizer).
- :func:`agent_sessions`: tool-using agents: a long system prompt shared by every
  session, a task context of the session's own, then many short steps (a tool call and
  its result) that are almost fully cached, with a rare long document (a cache miss of
  tens of thousands of tokens), as agent traffic is reported to look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .case_files import WorkloadRequest
from .pairs import Pair, request_class

SESSION_BLOCK_TOKENS = 256
"""Tokens per named block of a session (a multiple of vLLM's block sizes, 16 and 128)."""


def session_blocks(session: str, tokens: int, block_tokens: int,
                   shared: Sequence[str] = ()) -> tuple[str, ...]:
    """The names of a session turn's blocks over its ``tokens`` (prompt and answer): the
    ``shared`` names first (a prefix common to several sessions), then the session's own."""
    count = -(-tokens // block_tokens)
    return tuple(shared[:count]) + tuple(f"{session}/{j}"
                                         for j in range(len(shared), count))


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


# ------------------------------------------------------------------------------ chat


@dataclass(frozen=True)
class ChatParams:
    """Conversations start at ``session_rate_per_s`` (Poisson); between a turn and the
    next the user thinks ``think_s`` (log-uniform); a session ends before a turn whose
    prompt and answer would pass ``max_tokens``."""

    session_rate_per_s: float = 0.5
    think_s: tuple[float, float] = (3.0, 60.0)
    max_tokens: int = 16_384
    block_tokens: int = SESSION_BLOCK_TOKENS


def conversations(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """Each ShareGPT conversation's turns from its first kept one, up to its first turn
    the pool dropped (a gap would leave the history's length unknown)."""
    by_conversation: dict[int, list[Pair]] = {}
    for pair in pairs:
        by_conversation.setdefault(pair.conversation, []).append(pair)
    out = []
    for conversation in sorted(by_conversation):
        turns = sorted(by_conversation[conversation], key=lambda p: p.turn)
        run = [turns[0]]
        for pair in turns[1:]:
            if pair.turn != run[-1].turn + 2:  # human and assistant alternate
                break
            run.append(pair)
        out.append(run)
    return out


def chat_sessions(pairs: Sequence[Pair], num_requests: int, params: ChatParams = ChatParams(),
                  seed: int = 0) -> list[WorkloadRequest]:
    """``num_requests`` turns of ShareGPT conversations in random (seeded) order, as
    sessions in arrival order (module docstring)."""
    rng = np.random.default_rng(seed)
    sessions = conversations(pairs)
    requests: list[WorkloadRequest] = []
    start = 0.0
    for index in rng.permutation(len(sessions)):
        if len(requests) >= num_requests:
            break
        start += rng.exponential(1.0 / params.session_rate_per_s)
        turns = sessions[index]
        name = f"chat-{turns[0].conversation}"
        history, arrival = 0, start
        for k, pair in enumerate(turns, start=1):
            prompt = history + pair.prompt_tokens
            if prompt + pair.output_tokens > params.max_tokens or len(requests) >= num_requests:
                break
            if k > 1:
                arrival += _log_uniform(rng, *params.think_s)
            requests.append(WorkloadRequest(
                id=f"{name}-t{k}", arrival_s=arrival, prompt="", prompt_tokens=prompt,
                output_tokens=pair.output_tokens, tier=pair.tier,
                request_class=request_class(prompt), category="chat-sessions",
                blocks=session_blocks(name, prompt + pair.output_tokens, params.block_tokens),
                block_tokens=params.block_tokens, session=name, turn=k))
            history = prompt + pair.output_tokens
    if len(requests) < num_requests:
        raise ValueError(f"the pool's conversations give only {len(requests)} turns; "
                         f"lower the number of requests")
    return sorted(requests, key=lambda r: r.arrival_s)


# ----------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class AgentParams:
    """Agent sessions: ``system_tokens`` shared by every session (the system prompt and
    tool definitions), a task context of ``task_tokens`` of the session's own, then steps:
    each resends everything so far plus the last answer (the tool call) and the tool's
    result, ``result_tokens`` long, or one time in ``long_miss_every`` a document of
    ``long_result_tokens``. Answers are ``output_tokens`` long; the tool runs ``think_s``
    between an answer and the next step. Sessions start at ``session_rate_per_s``
    (Poisson), run ``steps`` steps at most and end before a step that would pass
    ``max_tokens``. Ranges are log-uniform."""

    session_rate_per_s: float = 0.1
    system_tokens: int = 6_144
    task_tokens: tuple[float, float] = (2_000, 24_000)
    steps: tuple[float, float] = (4, 40)
    result_tokens: tuple[float, float] = (100, 2_000)
    long_miss_every: int = 25
    long_result_tokens: tuple[float, float] = (20_000, 60_000)
    output_tokens: tuple[float, float] = (30, 400)
    think_s: tuple[float, float] = (0.5, 5.0)
    max_tokens: int = 131_072
    block_tokens: int = SESSION_BLOCK_TOKENS


def agent_sessions(num_requests: int, params: AgentParams = AgentParams(), seed: int = 0
                   ) -> list[WorkloadRequest]:
    """``num_requests`` agent steps, as sessions in arrival order (module docstring)."""
    rng = np.random.default_rng(seed)
    p = params
    shared = tuple(f"agent-system/{j}" for j in range(p.system_tokens // p.block_tokens))
    requests: list[WorkloadRequest] = []
    start, s = 0.0, 0
    while len(requests) < num_requests:
        start += rng.exponential(1.0 / p.session_rate_per_s)
        name, s = f"agent-{s}", s + 1
        steps = int(round(_log_uniform(rng, *p.steps)))
        history = p.system_tokens
        added = int(_log_uniform(rng, *p.task_tokens))
        arrival = start
        for k in range(1, steps + 1):
            prompt = history + added
            output = int(_log_uniform(rng, *p.output_tokens))
            if prompt + output > p.max_tokens or len(requests) >= num_requests:
                break
            requests.append(WorkloadRequest(
                id=f"{name}-t{k}", arrival_s=arrival, prompt="", prompt_tokens=prompt,
                output_tokens=output, tier=0, request_class=request_class(prompt),
                category="agent",
                blocks=session_blocks(name, prompt + output, p.block_tokens, shared),
                block_tokens=p.block_tokens, session=name, turn=k))
            history = prompt + output
            long = rng.integers(p.long_miss_every) == 0
            added = int(_log_uniform(rng, *(p.long_result_tokens if long
                                             else p.result_tokens)))
            arrival += _log_uniform(rng, *p.think_s)
    return sorted(requests, key=lambda r: r.arrival_s)
