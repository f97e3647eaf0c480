"""Conversations in the simulator: open loop replays every turn at its recorded time,
closed loop sends a session's next turn its recorded think time after the previous
answer, so the order of service moves the later arrivals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairsched_plugin.experiment import traces
from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.engine import simulate
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.sim.step_models import LinearStepModel

SETTINGS = SimSettings(max_num_batched_tokens=256, max_num_seqs=16, block_size=16,
                       kv_cache_tokens=1 << 18, enable_prefix_caching=True)
STEP = LinearStepModel(base_s=0.01, per_token_s=0.0005)


def _chat(tmp_path: Path):
    log = tmp_path / "chat.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        {"arrival_s": 0.0, "prompt_tokens": 400, "output_tokens": 60, "session": "a", "turn": 1},
        {"arrival_s": 0.1, "prompt_tokens": 900, "output_tokens": 80},
        {"arrival_s": 0.5, "prompt_tokens": 520, "output_tokens": 40, "session": "a", "turn": 2},
        {"arrival_s": 0.6, "prompt_tokens": 100, "output_tokens": 20, "session": "b", "turn": 1},
        {"arrival_s": 2.0, "prompt_tokens": 700, "output_tokens": 10, "session": "a", "turn": 3},
    ]))
    return traces.load_trace_case(log)


def test_closed_loop_sends_each_turn_its_think_time_after_the_previous_answer(
        tmp_path: Path) -> None:
    case = _chat(tmp_path)
    rows = {r["id"]: r for r in simulate(RunSpec(parse_arm("stock"), case, STEP, SETTINGS,
                                                 closed_loop=True)).run["requests"]}
    first, second, third = rows["chat-0"], rows["chat-2"], rows["chat-4"]
    assert first["arrival_s"] == 0.0
    # The recorded gap between the turns' arrivals is the think time.
    assert second["arrival_s"] == pytest.approx(first["finish_s"] + 0.5)
    assert third["arrival_s"] == pytest.approx(second["finish_s"] + 1.5)
    # Requests outside a session and first turns arrive as recorded.
    assert rows["chat-1"]["arrival_s"] == 0.1 and rows["chat-3"]["arrival_s"] == 0.6
    assert all(r["output_tokens"] == r["target_output_tokens"] for r in rows.values())


def test_open_loop_replays_every_turn_at_its_recorded_time(tmp_path: Path) -> None:
    case = _chat(tmp_path)
    rows = {r["id"]: r for r in simulate(RunSpec(parse_arm("stock"), case, STEP,
                                                 SETTINGS)).run["requests"]}
    assert [rows[f"chat-{i}"]["arrival_s"] for i in range(5)] == [0.0, 0.1, 0.5, 0.6, 2.0]
    # Turn 2 was sent before turn 1's answer: what open loop gets wrong.
    assert rows["chat-2"]["arrival_s"] < rows["chat-0"]["finish_s"]


def test_under_closed_loop_an_order_that_answers_sooner_brings_the_next_turn_sooner(
        tmp_path: Path) -> None:
    log = tmp_path / "race.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        {"arrival_s": 0.0, "prompt_tokens": 2000, "output_tokens": 5},
        {"arrival_s": 0.001, "prompt_tokens": 100, "output_tokens": 5, "session": "a",
         "turn": 1},
        {"arrival_s": 1.0, "prompt_tokens": 200, "output_tokens": 5, "session": "a", "turn": 2},
    ]))
    case = traces.load_trace_case(log)
    arrivals = {}
    for arm in ("stock", "spf"):
        rows = {r["id"]: r for r in simulate(RunSpec(parse_arm(arm), case, STEP, SETTINGS,
                                                     closed_loop=True)).run["requests"]}
        assert rows["race-2"]["arrival_s"] == pytest.approx(rows["race-1"]["finish_s"] + 0.999)
        arrivals[arm] = rows["race-2"]["arrival_s"]
    # FCFS prefills the 2,000-token prompt first; shortest-first answers turn 1 at once.
    assert arrivals["spf"] < arrivals["stock"]
