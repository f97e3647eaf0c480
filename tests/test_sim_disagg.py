"""Disaggregated prefill in the simulator: a prefill pool and a decode pool of vLLM's real
schedulers, the KV cache handed over through vLLM's KV-connector hooks. Each request is
prefilled once (one token) and decoded once (all its tokens); each pull takes exactly
its prompt's bytes over the link, one pull at a time per decode engine (the oracle is
the arithmetic, not the simulator's own bookkeeping); the prefill engine keeps a
request's blocks until its pull ends, so a full prefill engine waits for the decode side.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.disagg import simulate_disagg
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.sim.fleet import balance
from fairsched_plugin.sim.routers import parse_fleet
from fairsched_plugin.sim.step_models import LinearStepModel
from sim_cases import token_case
from test_sim_fleet import SETTINGS, STEP, _burst


@pytest.mark.parametrize("spec", ["1p1d", "2p2dxllm-d:stock", "2p1dxvllm-dp"])
@pytest.mark.parametrize("policy", ["stock", "guarded-srpf"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_each_request_is_prefilled_once_and_decoded_once(spec: str, policy: str,
                                                         async_scheduling: bool) -> None:
    settings = SimSettings(**{**SETTINGS.__dict__, "async_scheduling": async_scheduling})
    case = _burst()
    run = simulate_disagg(RunSpec(parse_arm(policy), case, STEP, settings), parse_fleet(spec),
                          bandwidth_gb_s=2.0).run
    rows = run["requests"]
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in case)
    by_id = {r.id: r for r in case}
    for row in rows:
        request = by_id[row["id"]]
        assert row["error"] is None
        assert row["arrival_s"] == request.arrival_s
        assert row["output_tokens"] == request.output_tokens
        # The prefill answers, the decode engine admits it, pulls, then samples.
        assert request.arrival_s <= row["first_scheduled_s"] <= row["handoff_s"]
        pulled = row["handoff_s"] + row["kv_wait_s"] + row["kv_transfer_s"]
        assert row["kv_wait_s"] >= 0 and pulled < row["first_token_s"] <= row["finish_s"]
    shares = run["meta"]["fleet"]["engines"]
    fleet = parse_fleet(spec)
    prefill = [s for s in shares if s["pool"] == "prefill"]
    decode = [s for s in shares if s["pool"] == "decode"]
    assert (len(prefill), len(decode)) == (fleet.engines, fleet.decode_engines)
    assert sum(s["requests"] for s in prefill) == sum(s["requests"] for s in decode) == len(case)
    assert sum(s["output_tokens"] for s in prefill) == len(case)  # one token each
    assert sum(s["output_tokens"] for s in decode) == sum(r.output_tokens for r in case)
    assert balance(run)["busy_max_over_mean"] >= 1.0


def test_a_pull_moves_the_prompts_bytes_over_the_link_one_at_a_time() -> None:
    bandwidth_gb_s = 0.25
    case = _burst(60)
    run = simulate_disagg(RunSpec(parse_arm("stock"), case, STEP, SETTINGS), parse_fleet("1p2d"),
                          bandwidth_gb_s=bandwidth_gb_s).run
    prompt = {r.id: r.prompt_tokens for r in case}
    spans: dict[int, list[tuple[float, float]]] = {}
    for row in run["requests"]:
        expected = prompt[row["id"]] * SETTINGS.kv_bytes_per_token / (bandwidth_gb_s * 1e9)
        assert row["kv_transfer_s"] == pytest.approx(expected, rel=1e-9)
        start = row["handoff_s"] + row["kv_wait_s"]
        spans.setdefault(row["engine"], []).append((start, start + row["kv_transfer_s"]))
    assert set(spans) == {0, 1}
    for pulls in spans.values():
        pulls.sort()
        assert all(later[0] >= earlier[1] - 1e-12 for earlier, later in zip(pulls, pulls[1:]))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_prefill_engine_keeps_a_requests_blocks_until_its_pull_ends(
        async_scheduling: bool) -> None:
    # Room for two of these prompts in each engine's KV cache: the third waits on the
    # prefill engine until the first one's blocks come back, when its pull ends.
    settings = SimSettings(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=2048,
                           block_size=16, kv_cache_tokens=2 * 1024 + 64,
                           async_scheduling=async_scheduling)
    case = token_case([(0.0, 1000, 4), (0.0, 1000, 4), (0.0, 1000, 4)])
    slow = 1000 * settings.kv_bytes_per_token / 1e9  # a 1-second pull at 1 GB/s

    def rows(bandwidth_gb_s: float) -> dict[str, dict]:
        run = simulate_disagg(RunSpec(parse_arm("stock"), case, STEP, settings),
                              parse_fleet("1p1d"),
                              bandwidth_gb_s=bandwidth_gb_s).run
        return {r["id"]: r for r in run["requests"]}

    held = rows(slow)
    first, third = held["r0000"], held["r0002"]
    first_pulled = first["handoff_s"] + first["kv_wait_s"] + first["kv_transfer_s"]
    assert first["kv_transfer_s"] == pytest.approx(1.0)
    assert third["first_scheduled_s"] >= first_pulled
    fast = rows(1000.0)
    assert fast["r0002"]["first_scheduled_s"] < first_pulled


def test_simulate_runs_disaggregated_pools_from_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fairsched_plugin.cli import main

    trace = tmp_path / "log.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{0.02 * i:.2f},{40 + (i * 37) % 300},{8 + i % 9}\n" for i in range(40)))
    common = ["simulate", "--trace", str(trace), "--step-model", "linear:2:0.1",
              "--max-num-batched-tokens", "256", "--max-num-seqs", "32",
              "--arms", "stock,guarded-srpf", "--out", str(tmp_path / "sim")]
    assert main([*common, "--disagg", "2p1dxvllm-dp:stock", "--kv-bandwidth", "5"]) == 0
    out = capsys.readouterr().out
    assert "stock: 2 prefill and 1 decode engines behind vllm-dp" in out
    config = json.loads((tmp_path / "sim" / "config.json").read_text())
    assert config["fleet"] == {"engines": 2, "router": "vllm-dp", "decode_engines": 1,
                               "decode_arm": "stock"}
    assert config["kv_bandwidth_gb_s"] == 5.0
    traces = sorted(p.name for p in (tmp_path / "sim" / "runs" / "guarded-srpf" / "r1").iterdir())
    assert traces == ["decode-0.jsonl", "prefill-0.jsonl", "prefill-1.jsonl"]
    with pytest.raises(SystemExit):
        main([*common, "--disagg", "4xllm-d"])
    assert "--disagg '4xllm-d': PpDd" in capsys.readouterr().err
    assert main([*common, "--disagg", "1p1d", "--engines", "2"]) == 2
    assert "--disagg names its own pools" in capsys.readouterr().err


def test_the_suite_measures_a_disaggregated_fleet_behind_its_own_capacity() -> None:
    from fairsched_plugin.sim.suite import fleet_runner_for, handoff_metrics

    runner = fleet_runner_for(parse_fleet("1p1d"), 2.0)
    result = runner(RunSpec(parse_arm("stock"), _burst(40), LinearStepModel(0.004, 0.00005),
                            SETTINGS), False)
    handoff = handoff_metrics(result.run["requests"])
    assert set(handoff) == {"wait_mean", "wait_p99", "pull_mean", "pull_p99"}
    assert 0 < handoff["pull_mean"] <= handoff["pull_p99"]
