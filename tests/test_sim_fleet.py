"""A simulated fleet: engines on their own clocks behind a router. One engine behind any
router is exactly the single-engine simulator; each router decides as the deployment it
stands for does, checked against decisions worked out by hand; every request is served
once, by the engine the router chose."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fairsched_plugin.experiment import traces
from fairsched_plugin.experiment.arms import parse_arm
from fairsched_plugin.experiment.case_files import WorkloadRequest
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.engine import simulate
from fairsched_plugin.sim.engine_settings import SimSettings
from fairsched_plugin.sim.fleet import balance, simulate_fleet
from fairsched_plugin.sim.routers import (EngineState, LlmdScorer, VllmDataParallel,
                                          make_router)
from fairsched_plugin.sim.step_models import LinearStepModel

STEP = LinearStepModel(base_s=0.004, per_token_s=0.00005)
SETTINGS = SimSettings(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=4096,
                       kv_cache_tokens=1 << 15)


def _burst(n: int = 120, seed: int = 3) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    return [WorkloadRequest(id=f"q{i}", arrival_s=round(0.01 * i + (i % 17 == 0) * 0.3, 4),
                            prompt="", prompt_tokens=rng.randint(16, 1500),
                            output_tokens=rng.randint(4, 80), tier=0, request_class="short",
                            category="fleet")
            for i in range(n)]


def _without_engine(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "engine"} for row in rows]


@pytest.mark.parametrize("policy", ["stock", "guarded-srpf"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_engine_behind_any_router_is_the_single_engine_simulator(
        policy: str, async_scheduling: bool) -> None:
    settings = SimSettings(**{**SETTINGS.__dict__, "async_scheduling": async_scheduling})
    arm = parse_arm(policy)
    case = sorted(_burst(), key=lambda r: r.arrival_s)
    alone = simulate(RunSpec(arm, case, STEP, settings))
    for router in ("round-robin", "vllm-dp", "llm-d"):
        fleet = simulate_fleet(RunSpec(arm, case, STEP, settings), 1, router)
        assert _without_engine(fleet.run["requests"]) == sorted(
            alone.run["requests"], key=lambda r: (r["arrival_s"], r["id"]))
        assert fleet.virtual_s == alone.virtual_s


def test_every_request_is_served_once_by_the_engine_its_router_chose() -> None:
    case = _burst()
    run = simulate_fleet(RunSpec(parse_arm("guarded-srpf"), case, STEP, SETTINGS), 4,
                         "round-robin").run
    rows = run["requests"]
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in case)
    assert all(r["output_tokens"] == r["target_output_tokens"] for r in rows)
    # Round robin: the k-th arrival goes to engine k mod 4.
    order = sorted(case, key=lambda r: (r.arrival_s, int(r.id[1:])))
    by_id = {r["id"]: r for r in rows}
    assert [by_id[r.id]["engine"] for r in order] == [k % 4 for k in range(len(order))]
    shares = run["meta"]["fleet"]["engines"]
    assert [s["requests"] for s in shares] == [30] * 4
    assert sum(s["output_tokens"] for s in shares) == sum(r.output_tokens for r in case)
    assert all(s["busy_s"] > 0 for s in shares)
    assert balance(run)["busy_max_over_mean"] >= 1.0


def test_a_fleet_keeps_each_engines_trace_apart(tmp_path: Path) -> None:
    run = simulate_fleet(RunSpec(parse_arm("stock"), _burst(40), STEP, SETTINGS), 2, "vllm-dp",
                         trace_dir=tmp_path).run
    assert {r["engine"] for r in run["trace"]} == {0, 1}
    assert (tmp_path / "engine-0.jsonl").is_file() and (tmp_path / "engine-1.jsonl").is_file()
    assert run["meta"]["trace_joined"] == 40


def _request(i: int, blocks: tuple[str, ...] = (), tokens: int = 64) -> WorkloadRequest:
    return WorkloadRequest(id=f"r{i}", arrival_s=0.0, prompt="", prompt_tokens=tokens,
                           output_tokens=4, tier=0, request_class="short", category="x",
                           blocks=blocks, block_tokens=16 if blocks else 0)


def test_vllm_dp_picks_the_lowest_score_as_vllms_balancer_computes_it() -> None:
    router = VllmDataParallel(3)
    # Engine 0: 2 waiting at 90% KV -> 2 + 2 * 6 * 0.4 = 6.8; engine 1: 4 running -> 4;
    # engine 2: 1 waiting + 2 running at 40% KV (no KV penalty below 50%) -> 3.
    states = [EngineState(2, 0, 0.9), EngineState(0, 4, 0.3), EngineState(1, 2, 0.4)]
    assert router.route(_request(0), 0.0, states) == 2
    # Within the coordinator's 100 ms the snapshot is not re-read: the client counted its
    # own request on engine 2 (score 4 + in flight), and the scan now starts at engine 1,
    # so the tie at 4 goes to engine 1.
    assert router.route(_request(1), 0.05, [EngineState(0, 0, 0.0)] * 3) == 1
    # A new snapshot 100 ms later: all idle, but the client's in-flight floor (1 each on
    # engines 1 and 2) sends the next request to engine 0.
    assert router.route(_request(2), 0.15, [EngineState(0, 0, 0.0)] * 3) == 0
    router.finished(2, _request(0))
    assert router.route(_request(3), 0.3, [EngineState(0, 0, 0.0)] * 3) == 2


def test_llm_d_weighs_prefix_affinity_queue_and_kv_as_its_default_profile() -> None:
    router = LlmdScorer(2, index_tokens=1 << 14)
    idle = [EngineState(0, 0, 0.0)] * 2
    shared = tuple(f"sys-{k}" for k in range(4))
    assert router.route(_request(0, shared), 0.0, idle) == 0
    # Equal load: the prefix held on engine 0 (4 of 4 blocks) wins against the rotation.
    assert router.route(_request(1, shared + ("u1",), 80), 0.1, idle) == 0
    assert router.scores(_request(2, shared), idle) == [3.0 + 2.0 + 2.0, 2.0 + 2.0]
    # A queue on engine 0 (3 waiting against none) costs it the whole queue weight, and
    # 60% KV usage 60% of the KV weight: 3 + 0 + 0.8 < 0 + 2 + 2.
    busy = [EngineState(3, 1, 0.6), EngineState(0, 1, 0.0)]
    assert router.route(_request(3, shared), 0.2, busy) == 1
    # Requests that name no blocks score on load alone.
    assert router.scores(_request(4), busy) == pytest.approx([0.8, 4.0])


def test_llm_d_forgets_the_least_recently_routed_prefix_beyond_its_index() -> None:
    router = LlmdScorer(2, index_tokens=64)  # 4 blocks of 16 tokens per engine
    idle = [EngineState(0, 0, 0.0)] * 2
    old = tuple(f"old-{k}" for k in range(4))
    assert router.route(_request(0, old), 0.0, idle) == 0
    router.route(_request(1, tuple(f"new-{k}" for k in range(4))), 0.1,
                 [EngineState(0, 0, 0.0), EngineState(5, 0, 0.0)])
    assert router.scores(_request(2, old), idle) == [2.0 + 2.0, 2.0 + 2.0]


def test_llm_d_keeps_conversations_on_the_engine_that_caches_them(tmp_path: Path) -> None:
    log = tmp_path / "chat.jsonl"
    turns = []
    for s in range(6):
        for t in range(3):
            turns.append({"arrival_s": 0.4 * s + 2.0 * t, "prompt_tokens": 300 + 400 * t,
                          "output_tokens": 30, "session": f"s{s}", "turn": t + 1})
    log.write_text("".join(json.dumps(r) + "\n" for r in sorted(turns,
                                                                key=lambda r: r["arrival_s"])))
    case = traces.load_trace_case(log)
    settings = SimSettings(**{**SETTINGS.__dict__, "enable_prefix_caching": True})
    by_router = {}
    for router in ("round-robin", "llm-d"):
        run = simulate_fleet(RunSpec(parse_arm("stock"), case, STEP, settings), 3, router).run
        engine_of = {row["id"]: row["engine"] for row in run["requests"]}
        engines_of: dict[str, set[int]] = {}
        for request in case:
            engines_of.setdefault(request.session, set()).add(engine_of[request.id])
        by_router[router] = (engines_of, sum(r["cached_tokens"] for r in run["requests"]))
    llmd_engines, llmd_cached = by_router["llm-d"]
    assert all(len(engines) == 1 for engines in llmd_engines.values())
    assert llmd_cached > by_router["round-robin"][1]


def test_bad_fleet_input_is_named() -> None:
    with pytest.raises(ValueError, match="at least one engine"):
        simulate_fleet(RunSpec(parse_arm("stock"), _burst(2), STEP, SETTINGS), 0, "round-robin")
    with pytest.raises(ValueError, match="unknown router 'nearest'.*round-robin, vllm-dp, "
                                         "llm-d"):
        make_router("nearest", 2, 1024)


def test_fleet_specs_are_parsed_and_bad_ones_named() -> None:
    from fairsched_plugin.sim.routers import Fleet, parse_fleet
    from fairsched_plugin.sim.suite import FULL

    assert parse_fleet("1") == Fleet(1)
    assert parse_fleet("8xllm-d") == Fleet(8, "llm-d")
    assert parse_fleet("1p1d") == Fleet(1, "round-robin", 1)
    assert parse_fleet("2p3dxllm-d:stock") == Fleet(2, "llm-d", 3, "stock")
    for bad in ("4", "0xvllm-dp", "4xnearest", "fourxllm-d", "4xllm-d:stock", "0p1d",
                "1p1", "1p1d:fcfs", "2p2dxnearest"):
        with pytest.raises(ValueError, match=f"fleet '{bad}': expected 1 .one engine., "
                                             "NxROUTER"):
            parse_fleet(bad)
    plan = FULL.__class__(("azure-conv",), ("h100",), ("qwen3-8b",), ("async",), (1.0,),
                          ("stock",), 10, fleets=("1", "4xvllm-dp"))
    assert plan.groups() == [("azure-conv", "h100", "qwen3-8b", "async", "1"),
                             ("azure-conv", "h100", "qwen3-8b", "async", "4xvllm-dp")]


def test_the_suite_refuses_a_bad_fleet_before_running(tmp_path: Path, capsys) -> None:
    from fairsched_plugin.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["suite", "--fleets", "4xnearest", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "fleet '4xnearest': expected" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_llm_d_work_reads_the_queue_in_prompt_tokens() -> None:
    by_count, by_work = LlmdScorer(2, 1 << 14), LlmdScorer(2, 1 << 14, queue_by_work=True)
    # Engine 0: one 8,000-token prompt waiting; engine 1: three 50-token ones.
    states = [EngineState(1, 2, 0.3, 8000), EngineState(3, 2, 0.3, 150)]
    assert by_count.route(_request(0), 0.0, states) == 0
    assert by_work.route(_request(0), 0.0, states) == 1
    assert by_work.name == "llm-d-work" and make_router("llm-d-work", 2, 1024).queue_by_work


def test_the_fleet_reports_each_engines_waiting_prompt_tokens() -> None:
    seen: list[list[EngineState]] = []

    class Recording(LlmdScorer):
        def route(self, request, now, engines):
            seen.append(list(engines))
            return super().route(request, now, engines)

    burst = [_request(i, tokens=400 + i) for i in range(40)]
    simulate_fleet(RunSpec(parse_arm("stock"), burst, STEP, SETTINGS), 2,
                   Recording(2, 1 << 14, queue_by_work=True))
    # All arrive at once: before the first step, every routed prompt still waits.
    routed = [0, 0]
    for i, states in enumerate(seen):
        assert [s.waiting_prompt_tokens for s in states] == routed
        routed[[s.waiting_prompt_tokens for s in states].index(min(
            s.waiting_prompt_tokens for s in states))] += 400 + i


def test_simulate_runs_a_fleet_from_the_command_line(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from fairsched_plugin.cli import main

    trace = tmp_path / "log.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{0.02 * i:.2f},{40 + (i * 37) % 300},{8 + i % 9}\n" for i in range(60)))
    assert main(["simulate", "--trace", str(trace), "--step-model", "linear:2:0.1",
                 "--max-num-batched-tokens", "256", "--max-num-seqs", "32",
                 "--arms", "stock,guarded-srpf", "--engines", "2", "--router", "vllm-dp",
                 "--out", str(tmp_path / "sim")]) == 0
    out = capsys.readouterr().out
    assert "stock: 2 engines behind vllm-dp; requests per engine" in out
    config = json.loads((tmp_path / "sim" / "config.json").read_text())
    assert config["fleet"] == {"engines": 2, "router": "vllm-dp", "decode_engines": 0,
                               "decode_arm": None}
    traces = sorted(p.name for p in (tmp_path / "sim" / "runs" / "stock" / "r1").iterdir())
    assert traces == ["engine-0.jsonl", "engine-1.jsonl"]
