"""End to end: ``fairsched bench`` replays a small case against a real server and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from fairsched_plugin.cli import main  # noqa: E402
from fairsched_plugin.experiment.case_files import WorkloadRequest, write_case  # noqa: E402

pytestmark = pytest.mark.slow


def _case(path: Path) -> Path:
    requests = [
        WorkloadRequest(
            id=f"e2e-{i}",
            arrival_s=0.05 * i,
            prompt="Tell me about scheduling. " * (1 + 7 * (i % 4)),
            prompt_tokens=1 + 5 * (1 + 7 * (i % 4)),
            output_tokens=8 + i,
            tier=0,
            request_class="short",
            category="e2e",
        )
        for i in range(12)
    ]
    # Longer than --max-model-len: the server refuses it, the run goes on.
    requests.append(WorkloadRequest(
        id="e2e-too-long", arrival_s=0.2, prompt="word " * 3000, prompt_tokens=3001,
        output_tokens=8, tier=0, request_class="long", category="e2e",
    ))
    write_case(path, requests)
    return path


def test_bench_replays_reports_and_joins_the_trace(tiny_model: Path, tmp_path: Path):
    out = tmp_path / "bench"
    code = main([
        "bench", "--arms", "aging", "--case", str(_case(tmp_path / "case.jsonl")),
        "--model-dir", str(tiny_model), "--max-model-len", "1024", "--engine-arg=--enforce-eager",
        "--out", str(out),
    ])
    assert code == 0
    run_dir = out / "runs" / "aging" / "r1"
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in requests}
    assert len(by_id) == 13
    assert "HTTP 400" in by_id["e2e-too-long"]["error"]
    good = [r for r in requests if r["id"] != "e2e-too-long"]
    assert all(r["error"] is None for r in good)
    assert all(r["output_tokens"] == r["target_output_tokens"] for r in good)
    assert all(r["arrival_s"] <= r["first_token_s"] <= r["finish_s"] for r in good)
    # The scheduler's trace covered the replay, and every served prompt's prefill was found.
    trace = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]
    assert trace and all(record["step_time_s"] is not None for record in trace)
    assert all(r["prefill_done_s"] is not None for r in good)
    assert all(
        r["arrival_s"] <= r["admitted_s"] <= r["prefill_done_s"] <= r["first_token_s"]
        for r in good
    )
    assert "vllm:" in (run_dir / "metrics.prom").read_text()
    report = json.loads((out / "report.json").read_text())
    summary = report["arms"]["aging"]["repeats"][0]["summary"]
    assert summary["requests"]["completed"] == 12 and summary["requests"]["failed"] == 1
    for name in ("report.md", "e2e_cdf.png", "ttft_frontier.png"):
        assert (out / name).stat().st_size > 0


def test_bench_replays_several_workloads_per_server_in_ranked_mode(
    tiny_model: Path, tmp_path: Path
):
    """One server start replays two generated workloads, with af-lcb under the paper's
    ranked service; the report has the per-category tables."""
    out = tmp_path / "suite"
    code = main([
        "bench", "--arms", "af-lcb", "--workload", "steady_short,bursty_conversational",
        "--num-requests", "8", "--max-output-tokens", "32", "--max-prompt-tokens", "600",
        "--service", "ranked", "--max-batch-size", "3", "--max-pairs", "400",
        "--tier-weights", "0.5,0.5",
        "--model-dir", str(tiny_model), "--max-model-len", "1024", "--engine-arg=--enforce-eager",
        "--out", str(out),
    ])
    assert code == 0
    for name in ("steady_short", "bursty_conversational"):
        run_dir = out / "runs" / "af-lcb" / "r1" / name
        requests = [json.loads(line)
                    for line in (run_dir / "requests.jsonl").read_text().splitlines()]
        assert len(requests) == 8 and all(r["error"] is None for r in requests)
        assert all(r["output_tokens"] == r["target_output_tokens"] for r in requests)
    trace = [json.loads(line) for line in
             (out / "runs" / "af-lcb" / "r1" / "trace.jsonl").read_text().splitlines()]
    assert max(record["num_decodes"] + record["num_prefills"] for record in trace) <= 3
    markdown = (out / "report.md").read_text()
    assert "the ordering-policies paper's Tables 2 and 3 layout" in markdown
    assert "ranked service" in (out / "runs" / "af-lcb" / "r1" / "server.log").read_text()
