"""``fairsched tune`` finds the known best setting of a case built to have one."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from fairsched_plugin.experiment.case_files import WorkloadRequest
from fairsched_plugin.config import load_config
from fairsched_plugin.sim.tune import Candidate, expand, frontier, judge


def _case(path: Path, output_tokens: int = 4) -> Path:
    """Every 4th request a 400-token prompt, the rest 16 tokens, arriving faster than a
    64-token budget serves: shortest-prompt-first (Aging with a tiny alpha) gives the
    lowest median TTFT; a huge alpha is arrival order, no better than stock."""
    rows = []
    for i in range(48):
        prompt = 400 if i % 4 == 0 else 16
        rows.append(WorkloadRequest(id=f"t{i:02d}", arrival_s=0.01 * i, prompt="x",
                                    prompt_tokens=prompt, output_tokens=output_tokens, tier=0,
                                    request_class="short" if prompt < 128 else "medium",
                                    category="tune"))
    path.write_text("".join(r.to_json() + "\n" for r in rows))
    return path


NO_LIMITS = ("--max-p99-ratio", "100", "--max-e2e-ratio", "100", "--min-throughput-ratio", "0")
"""Bounds loose enough that only the median TTFT (and any cap a test adds) decides."""


def _tune(case: Path, out: Path, space: str, *options: str) -> int:
    """``fairsched tune`` on ``case`` with a 64-token budget and 16 sequences."""
    from fairsched_plugin.cli import main

    return main(["tune", "--case", str(case), "--space", space,
                 "--step-model", "linear:2:0.1", "--max-num-batched-tokens", "64",
                 "--max-num-seqs", "16", *options, "--out", str(out)])


def test_expand_makes_every_combination() -> None:
    assert expand("aging:alpha={1,2}:beta={-1,0}") == [
        "aging:alpha=1:beta=-1", "aging:alpha=1:beta=0",
        "aging:alpha=2:beta=-1", "aging:alpha=2:beta=0"]
    assert expand("fcfs") == ["fcfs"]


def test_frontier_drops_dominated_points() -> None:
    a, b, c = (Candidate("a", 1, 5, 0, 0), Candidate("b", 2, 2, 0, 0),
               Candidate("c", 3, 6, 0, 0))
    assert [x.arm for x in frontier([a, b, c])] == ["a", "b"]


def test_a_tpot_cap_rules_out_a_candidate_whose_stream_stalls() -> None:
    base = Candidate("stock", 1.0, 2.0, 5.0, 100.0, tpot_p99=0.05)
    stalls = Candidate("held", 0.2, 2.0, 5.0, 100.0, tpot_p99=0.30)  # 6x stock's TPOT
    bounded = Candidate("bounded", 0.3, 2.0, 5.0, 100.0, tpot_p99=0.10)  # 2x
    limits = Namespace(max_p99_ratio=1.1, max_e2e_ratio=1.0, min_throughput_ratio=0.95,
                       max_tpot_ratio=None)
    judge([base, stalls, bounded], base, limits)
    assert stalls.feasible and bounded.feasible
    assert stalls.ratios[4] == pytest.approx(6.0) and bounded.ratios[4] == pytest.approx(2.0)
    limits.max_tpot_ratio = 3.0
    judge([base, stalls, bounded], base, limits)
    assert not stalls.feasible and bounded.feasible


def test_single_token_outputs_have_no_tpot_and_no_tpot_ratio(tmp_path: Path, capsys) -> None:
    """No request has a second token: TPOT is unmeasured, so the cap judges nothing."""
    code = _tune(_case(tmp_path / "case.jsonl", output_tokens=1), tmp_path / "t",
                 "aging:alpha={0.001,1000000}", *NO_LIMITS, "--max-tpot-ratio", "0.5")
    assert code == 0
    assert "best: aging:alpha=0.001 (median TTFT" in capsys.readouterr().out


def test_tune_finds_the_known_best(tmp_path: Path, capsys) -> None:
    out = tmp_path / "tune"
    code = _tune(_case(tmp_path / "case.jsonl"), out, "aging:alpha={0.001,1000000}",
                 *NO_LIMITS)
    assert code == 0
    printed = capsys.readouterr().out
    assert "best: aging:alpha=0.001" in printed
    assert "| P99 TPOT (ms) |" in printed
    config = json.loads((out / "best.json").read_text())
    assert load_config(config, environ={}).aging.alpha == 0.001
    assert (out / "tune.png").stat().st_size > 0


def test_tune_says_so_when_nothing_beats_stock(tmp_path: Path, capsys) -> None:
    """fcfs schedules exactly like stock, so its mean E2E is 1.0x stock's: a cap of 0.5x
    leaves no candidate."""
    code = _tune(_case(tmp_path / "case.jsonl"), tmp_path / "t", "fcfs",
                 "--max-e2e-ratio", "0.5")
    assert code == 1
    assert "no candidate meets the objective" in capsys.readouterr().out


def test_a_candidate_no_faster_than_stock_does_not_win(tmp_path: Path, capsys) -> None:
    """fcfs meets every bound (it is stock's schedule) but does not lower the median."""
    code = _tune(_case(tmp_path / "case.jsonl"), tmp_path / "t", "fcfs")
    assert code == 1
    assert "stock vLLM stays best" in capsys.readouterr().out


def test_a_tpot_cap_no_candidate_meets_leaves_stock(tmp_path: Path, capsys) -> None:
    """The known best of the first test decodes no faster than stock: asking for half of
    stock's P99 TPOT leaves no candidate."""
    code = _tune(_case(tmp_path / "case.jsonl"), tmp_path / "t",
                 "aging:alpha={0.001,1000000}", *NO_LIMITS, "--max-tpot-ratio", "0.5")
    assert code == 1
    assert "stock vLLM stays best" in capsys.readouterr().out
