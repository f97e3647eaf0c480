"""The simulator's prefix cache is vLLM's own: requests that name shared blocks (a
Mooncake trace's hash_ids, a conversation's turns) hit it exactly where a cache of every
computed block would, checked against an independent oracle on requests that arrive one
after another (nothing evicted, nothing in flight)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fairsched_plugin.experiment import traces
from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.experiment.sessions import AgentParams, agent_sessions
from fairsched_plugin.experiment.stand_in_tokens import sequence, token_ids
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.engine import simulate
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.sim.step_models import LinearStepModel

BLOCK = 16
SETTINGS = SimSettings(max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=131_072,
                       block_size=BLOCK, kv_cache_tokens=1 << 23, enable_prefix_caching=True)
STEP = LinearStepModel(base_s=0.002, per_token_s=0.00001)


def cached_by_oracle(case, block: int = BLOCK) -> list[int]:
    """Each request's cached prompt tokens under a cache that keeps every full block of
    every earlier request's computed tokens (its prompt and all but its last output
    token, which is sampled and never computed; a session turn's answer is the one its
    blocks name), keyed by the whole prefix it ends; a request computes at least its last
    prompt token."""
    seen: set[tuple[int, ...]] = set()
    cached = []
    for request in case:
        prompt = token_ids(request, 0, request.prompt_tokens)
        k = 0
        while (k + 1) * block <= request.prompt_tokens - 1 and tuple(
                prompt[:(k + 1) * block]) in seen:
            k += 1
        cached.append(k * block)
        answer = (token_ids(request, request.prompt_tokens, request.output_tokens)
                  if request.session else [1] * request.output_tokens)
        computed = prompt + answer[:-1]
        seen.update(tuple(computed[:j * block]) for j in range(1, len(computed) // block + 1))
    return cached


def _one_after_another(case, gap_s: float = 1000.0):
    return [replace(r, arrival_s=gap_s * i) for i, r in enumerate(case)]


def test_a_mooncake_window_hits_the_cache_where_the_oracle_does() -> None:
    """Async (the conversation test below runs both modes)."""
    case = _one_after_another(traces.trace_case(
        traces.window(traces.read_trace("mooncake-conv"), 20), "mooncake-conv"))
    run = simulate(RunSpec(parse_arm("stock"), case, STEP,
                           replace(SETTINGS, async_scheduling=True)))
    got = [r["cached_tokens"] for r in run.run["requests"]]
    expected = cached_by_oracle(case)
    assert got == expected
    assert sum(expected) >= 19 * 512  # every request after the first shares a prefix


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_conversations_next_turn_finds_its_prompt_and_answer_cached(
        tmp_path: Path, async_scheduling: bool) -> None:
    log = tmp_path / "chat.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        {"arrival_s": 0, "prompt_tokens": 300, "output_tokens": 100, "session": "a", "turn": 1},
        {"arrival_s": 1, "prompt_tokens": 250, "output_tokens": 30, "session": "b", "turn": 1},
        {"arrival_s": 2, "prompt_tokens": 520, "output_tokens": 20, "session": "a", "turn": 2},
        {"arrival_s": 3, "prompt_tokens": 900, "output_tokens": 5, "session": "a", "turn": 3},
    ]))
    case = _one_after_another(traces.load_trace_case(log))
    run = simulate(RunSpec(parse_arm("guarded-srpf"), case, STEP,
                           replace(SETTINGS, async_scheduling=async_scheduling)))
    got = [r["cached_tokens"] for r in run.run["requests"]]
    assert got == cached_by_oracle(case)
    # Turn 2 repeats turn 1's 300 + 100 tokens: all of them but the never-computed last
    # answer token, in whole blocks.
    assert got[2] == (300 + 100 - 1) // BLOCK * BLOCK
    assert got[3] == (520 + 20 - 1) // BLOCK * BLOCK


def test_without_the_cache_nothing_is_found() -> None:
    case = _one_after_another(traces.trace_case(
        traces.window(traces.read_trace("mooncake-conv"), 5), "mooncake-conv"))
    run = simulate(RunSpec(parse_arm("stock"), case, STEP,
                           replace(SETTINGS, enable_prefix_caching=False)))
    assert [r["cached_tokens"] for r in run.run["requests"]] == [0] * 5


def test_agent_sessions_hit_the_shared_system_prompt_and_their_own_history() -> None:
    case = _one_after_another(agent_sessions(24, AgentParams(max_tokens=30_000)))
    run = simulate(RunSpec(parse_arm("guarded-srpf"), case, STEP, SETTINGS))
    got = [r["cached_tokens"] for r in run.run["requests"]]
    assert got == cached_by_oracle(case)
    firsts = [g for g, r in zip(got, case) if r.turn == 1]
    assert len(firsts) >= 2 and all(g >= AgentParams().system_tokens - BLOCK for g in firsts[1:])


def test_differently_named_blocks_share_no_vllm_block() -> None:
    """Stand-in ids are per name: thousands of names, no 16 equal tokens (a false hit)."""
    starts = {tuple(sequence(f"block-{i}", 0, BLOCK)) for i in range(5000)}
    assert len(starts) == 5000
