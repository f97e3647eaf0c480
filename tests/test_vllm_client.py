"""``vllm bench serve`` as the second client: its command line, rate and saved result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairsched_plugin.bench import vllm_client
from fairsched_plugin.experiment import case_files
from fairsched_plugin.experiment.case_files import WorkloadRequest


def case(arrivals):
    return [
        WorkloadRequest(id=f"r{i}", arrival_s=t, prompt=f"p{i}", prompt_tokens=3,
                        output_tokens=5, tier=0, request_class="short", category="c")
        for i, t in enumerate(arrivals)
    ]


def test_mean_rate_is_requests_over_the_arrival_span():
    assert case_files.mean_rate(case([0.0, 0.5, 1.0, 2.0])) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        case_files.mean_rate(case([1.0]))


def test_command_replays_the_case_in_order_with_exact_lengths(tmp_path: Path):
    cmd = vllm_client.command("http://127.0.0.1:8000", "m", "tok", tmp_path / "d.jsonl", 300,
                              40.0, tmp_path)
    text = " ".join(cmd)
    for flag in ("--dataset-name custom", "--custom-output-len -1", "--ignore-eos",
                 "--disable-shuffle", "--skip-chat-template", "--num-prompts 300",
                 "--request-rate 40", "--burstiness 1.0", "--save-result"):
        assert flag in text
    assert cmd[1:3] == ["-m", "fairsched_plugin.bench.vllm_client"]


def test_read_result_takes_the_headline_figures_and_refuses_a_partial_file(tmp_path: Path):
    saved = {"median_ttft_ms": 1.0, "mean_ttft_ms": 2.0, "p99_ttft_ms": 3.0,
             "mean_e2el_ms": 4.0, "output_throughput": 5.0, "completed": 6,
             "mean_tpot_ms": 7.0, "p99_tpot_ms": 8.0, "duration": 9.0,
             "total_output_tokens": 10}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(saved))
    assert vllm_client.read_result(path) == {
        "ttft_p50_ms": 1.0, "ttft_mean_ms": 2.0, "ttft_p99_ms": 3.0, "e2e_mean_ms": 4.0,
        "output_tokens_per_s": 5.0, "completed": 6, "tpot_mean_ms": 7.0, "tpot_p99_ms": 8.0,
        "duration_s": 9.0, "output_tokens": 10}
    path.write_text(json.dumps({"median_ttft_ms": 1.0}))
    with pytest.raises(ValueError, match="mean_e2el_ms"):
        vllm_client.read_result(path)
