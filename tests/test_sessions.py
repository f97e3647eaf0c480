"""Multi-turn session cases: every turn repeats its session's previous prompt and answer
(the same block names), turns arrive in order with their think time, agent sessions
share the system prompt's blocks and rarely add a long document."""

from __future__ import annotations

from collections import defaultdict

import pytest

from fairsched_plugin.experiment.pairs import Pair
from fairsched_plugin.experiment.sessions import (AgentParams, ChatParams, agent_sessions,
                                             chat_sessions, conversations, session_blocks)


def test_session_blocks_put_the_shared_names_first() -> None:
    assert session_blocks("s", 600, 256) == ("s/0", "s/1", "s/2")
    assert session_blocks("s", 600, 256, ("sys/0",)) == ("sys/0", "s/1", "s/2")
    assert session_blocks("s", 100, 256, ("sys/0", "sys/1")) == ("sys/0",)


def _pair(conversation: int, turn: int, prompt: int, output: int) -> Pair:
    return Pair("x", prompt, output, 0, conversation, turn)


def test_a_conversation_stops_at_its_first_dropped_turn() -> None:
    pairs = [_pair(1, 0, 10, 20), _pair(1, 2, 30, 40), _pair(1, 6, 5, 5), _pair(2, 1, 7, 8)]
    assert [[p.turn for p in c] for c in conversations(pairs)] == [[0, 2], [1]]


def _by_session(case):
    sessions = defaultdict(list)
    for request in case:
        sessions[request.session].append(request)
    return sessions


def _check_sessions(case, think: tuple[float, float]) -> None:
    assert [r.arrival_s for r in case] == sorted(r.arrival_s for r in case)
    for turns in _by_session(case).values():
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        for before, after in zip(turns, turns[1:]):
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
            whole = (before.prompt_tokens + before.output_tokens) // before.block_tokens
            assert after.blocks[:whole] == before.blocks[:whole]
            assert think[0] <= after.arrival_s - before.arrival_s <= think[1]


def test_chat_turns_resend_the_history_the_conversation_implies() -> None:
    pairs = [_pair(c, 2 * t, 50 + 7 * t, 100 + c, ) for c in range(30) for t in range(c % 4 + 1)]
    case = chat_sessions(pairs, 40, ChatParams(max_tokens=900), seed=1)
    assert len(case) == 40
    _check_sessions(case, ChatParams().think_s)
    for turns in _by_session(case).values():
        history = 0
        for t, request in enumerate(turns):
            assert request.prompt_tokens == history + 50 + 7 * t
            assert request.prompt_tokens + request.output_tokens <= 900
            history = request.prompt_tokens + request.output_tokens


def test_too_few_conversations_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="only 2 turns"):
        chat_sessions([_pair(0, 0, 10, 10), _pair(0, 2, 10, 10)], 5)


def test_agent_sessions_share_the_system_prompt_and_sometimes_miss_long() -> None:
    params = AgentParams()
    case = agent_sessions(600, params, seed=3)
    _check_sessions(case, params.think_s)
    system = params.system_tokens // params.block_tokens
    assert len({r.blocks[:system] for r in case}) == 1
    assert all(r.prompt_tokens + r.output_tokens <= params.max_tokens for r in case)
    growth = [after.prompt_tokens - before.prompt_tokens - before.output_tokens
              for turns in _by_session(case).values() for before, after in zip(turns, turns[1:])]
    long = [g for g in growth if g >= params.long_result_tokens[0]]
    assert 0 < len(long) < len(growth) / 10
    assert max(growth) <= params.long_result_tokens[1]
    assert agent_sessions(600, params, seed=3) == case
