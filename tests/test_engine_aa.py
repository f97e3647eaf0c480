"""benchmarks/engine_aa.py's reading of a run: paired ratios, their interval, the table.

The analysis is checked on planted rounds whose ratios are known; one slow test per mode
(the engine alone with arrivals, a server through ``vllm bench serve``; the project's
replay client on a real server is test_bench_e2e's) runs two arms for two rounds on the
tiny model (docs/benchmark.md says how to read the benchmark). The engine-alone mode
without arrivals runs the same worker with one ``LLM.generate`` call in place of the
arrival loop, and is left to the arrivals mode's test for CI time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_aa import geomean_ci  # noqa: E402


def test_a_constant_ratio_has_no_spread() -> None:
    mean, low, high = geomean_ci([1.1] * 12)
    assert math.isclose(mean, 1.1) and math.isclose(low, 1.1) and math.isclose(high, 1.1)


def test_the_interval_holds_the_geometric_mean_and_narrows_with_rounds() -> None:
    ratios = [0.9, 1.2, 1.0, 1.1, 0.95, 1.05]
    mean, low, high = geomean_ci(ratios)
    assert math.isclose(mean, math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert low < mean < high
    _, low4, high4 = geomean_ci(ratios * 4)
    assert high4 - low4 < (high - low) * 0.7


def _round(wall: float, **extra: float) -> dict[str, float]:
    return {"wall_s": wall, "engine_cpu_s": 2 * wall, "own_cpu_s": 0.4,
            "output_tokens": 1000, **extra}


def test_table_pairs_each_round_with_the_first_arm(tmp_path: Path) -> None:
    # stock's rounds swing by 2x; the plugin's arm is 1.25x of stock in each round, so the
    # paired ratio is exact while the unpaired walls overlap.
    stock = [_round(w) for w in (4.0, 8.0, 6.0)]
    arm = [_round(1.25 * r["wall_s"], steps=100, mean_step_ms=50.0) for r in stock]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"stock": stock, "fcfs": arm}))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_aa.py"), "--table", str(results)],
        capture_output=True, text=True, check=True, timeout=120).stdout
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| arm")}
    assert "| 1.250 [1.250-1.250] | 1.250 [1.250-1.250] |" in rows["fcfs"]
    assert "| 1.000 [1.000-1.000] | 1.000 [1.000-1.000] |" in rows["stock"]
    assert "| 100 [100-100] | 50.0 [50.0-50.0] |" in rows["fcfs"]
    assert rows["stock"].rstrip().endswith("| - | - |")


def test_table_pairs_with_another_base_on_request(tmp_path: Path) -> None:
    stock = [_round(w) for w in (4.0, 8.0)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"stock": stock,
                                   "fcfs": [_round(2 * r["wall_s"]) for r in stock]}))
    table = [sys.executable, str(ROOT / "benchmarks" / "engine_aa.py"), "--table", str(results)]
    out = subprocess.run([*table, "--base", "fcfs"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert "against fcfs" in out
    assert "| 0.500 [0.500-0.500] | 0.500 [0.500-0.500] |" in out.split("| stock |")[1]
    done = subprocess.run([*table, "--base", "aging"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "the run has arms stock, fcfs" in done.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--client", "vllm-bench"], "--client needs --server"),
    (["--server", "--arrivals"], "--arrivals is the engine-alone mode's"),
], ids=["a client needs a server", "arrivals belong to the engine alone"])
def test_modes_that_do_not_mix_are_refused(tmp_path: Path, flags: list[str],
                                           message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_aa.py"), "--case",
         str(tmp_path / "case.jsonl"), *flags],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "plugin_arm"),
                         [(["--arrivals"], "fcfs"),
                          (["--server", "--client", "vllm-bench"], "fcfs#2")],
                         ids=["engine-arrivals", "server-vllm-bench"])
def test_a_real_round_serves_every_arm_the_same_work(tiny_model: Path, tmp_path: Path,
                                                     mode: list[str], plugin_arm: str) -> None:
    """Two arms, two rounds on the tiny model: every request decodes its case length in
    every arm, the plugin arm's trace is read per round (``fcfs#2``: an instance suffix
    starts the same arm), and the engines stop."""
    pytest.importorskip("vllm")
    from fairsched_plugin.experiment.case_files import WorkloadRequest, write_case

    case = tmp_path / "case.jsonl"
    write_case(case, [
        WorkloadRequest(id=f"aa-{i}", arrival_s=0.25 * i,
                        prompt="Tell me about scheduling. " * (1 + 3 * (i % 3)),
                        prompt_tokens=1 + 5 * (1 + 3 * (i % 3)), output_tokens=4 + i,
                        tier=0, request_class="short", category="aa")
        for i in range(8)
    ])
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "engine_aa.py"), *mode,
         "--case", str(case), "--model", str(tiny_model), "--arms", f"stock,{plugin_arm}",
         "--rounds", "2", "--max-model-len", "1024", "--enforce-eager", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        stdout, stderr = process.communicate(timeout=1500)
    finally:
        if process.poll() is None:  # SIGTERM first: the benchmark then stops its servers
            process.terminate()
            try:
                process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
    assert process.returncode == 0, stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["stock", plugin_arm]
    expected = sum(4 + i for i in range(8))
    for runs in results.values():
        assert len(runs) == 2
        assert all(run["output_tokens"] == expected and run["wall_s"] > 0 for run in runs)
    assert all(run["steps"] > 0 for run in results[plugin_arm])
    assert all("steps" not in run for run in results["stock"])
    assert all(0 < run["ttft_p50_s"] <= run["ttft_p99_s"] for run in results[plugin_arm])
    assert all(0 < run["ttft_mean_s"] <= run["e2e_mean_s"] for run in results[plugin_arm])
    assert "x mean TTFT" in stdout
    if "--arrivals" in mode:  # held back until its arrival, the last request ends after it
        assert all(run["wall_s"] > 0.25 * 7 for runs in results.values() for run in runs)
        # Counted on the worker's side, so for stock too.
        assert all(run["output_steps"] > 0 for runs in results.values() for run in runs)
        assert "x steps with output" in stdout
    if "vllm-bench" in mode:  # each round's own arrivals: the seed follows the round
        for index in range(2):
            log = (out / f"vllm-bench-{index}" / "vllm-bench.log").read_text()
            assert "--seed 1" in log.splitlines()[0]
    assert f"| {plugin_arm} |" in stdout
