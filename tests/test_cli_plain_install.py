"""The CLI on a plain vLLM install: with matplotlib, pandas and ONNX Runtime (and onnx)
unimportable every verb works or names the extra to install in one line, no traceback;
``--help`` and argument errors come before vLLM or torch are imported; the simulator's
engine follows the step model's device, and what it used is printed and recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKED = ("matplotlib", "pandas", "onnxruntime", "onnx")

_RUN = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # import raises ModuleNotFoundError, as if not installed
from fairsched_plugin.cli import main
code = main(sys.argv[1:])
heavy = [m for m in ("vllm", "torch") if m in sys.modules]
print("IMPORTED:" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def _fairsched(*args: str, blocked: tuple[str, ...] = BLOCKED, cwd: Path | None = None
               ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _RUN.format(blocked=blocked), *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def _imported(result: subprocess.CompletedProcess) -> list[str]:
    line = [l for l in result.stderr.splitlines() if l.startswith("IMPORTED:")]
    return [m for m in line[-1].removeprefix("IMPORTED:").split(",") if m] if line else []


def _case_file(folder: Path, n: int, *, gap_s: float, prompt_tokens: int) -> Path:
    """A case file of ``n`` short requests (4 output tokens) every ``gap_s`` seconds."""
    case = folder / "case.jsonl"
    case.write_text("".join(
        json.dumps({"id": f"r{i}", "arrival_s": gap_s * i, "prompt": "",
                    "prompt_tokens": prompt_tokens, "output_tokens": 4, "tier": 0,
                    "category": "t", "class": "short"}) + "\n"
        for i in range(n)))
    return case


def test_help_imports_neither_vllm_nor_torch() -> None:
    result = _fairsched("--help")
    assert result.returncode == 0 and "simulate" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [
    ["simulate", "--workload", "uniform", "--step-model", "linear:1:0.01",
     "--case", "missing.jsonl"],
    ["simulate", "--case", "missing.jsonl", "--step-model", "analytic:h100:nope"],
    ["capacity", "--case", "missing.jsonl", "--step-model", "linear:1:0.01"],
    ["simulate", "--case", "missing.jsonl", "--step-model", "linear:1:0.01",
     "--max-num-seqs", "0"],
])
def test_bad_input_is_reported_before_vllm_is_imported(args: list[str]) -> None:
    result = _fairsched(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "error" in result.stderr
    assert _imported(result) == [], result.stderr


def test_simulate_and_capacity_run_without_the_bench_and_predictor_extras(tmp_path: Path
                                                                         ) -> None:
    case = _case_file(tmp_path, 120, gap_s=0.01, prompt_tokens=50)
    out = tmp_path / "sim"
    result = _fairsched("simulate", "--case", str(case), "--step-model", "linear:2:0.01",
                        "--arms", "stock,fcfs", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "without plots" in result.stderr and "'bench' extra" in result.stderr
    assert (out / "report.md").exists() and not list(out.glob("*.png"))
    result = _fairsched("capacity", "--case", str(case), "--step-model", "linear:2:0.01",
                        "--max-num-seqs", "8")
    assert result.returncode == 0, result.stderr
    assert "capacity:" in result.stdout


def test_lprs_predictor_names_the_predictor_extra(tmp_path: Path) -> None:
    result = _fairsched("lprs-predictor", "--model", "qwen3-8b", "--device", "h100",
                        "--max-num-batched-tokens", "8192", "--max-num-seqs", "256",
                        "--max-model-len", "16384", "--samples", "400",
                        "--out", str(tmp_path / "model.onnx"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "'predictor' extra" in result.stderr


def test_an_accelerator_step_model_simulates_vllms_engine_for_that_device(tmp_path: Path
                                                                          ) -> None:
    case = _case_file(tmp_path, 20, gap_s=0.05, prompt_tokens=100)
    runs = {}
    for name, model in (("h100", "analytic:h100:qwen3-8b"), ("cpu", "linear:2:0.01")):
        out = tmp_path / name
        result = _fairsched("simulate", "--case", str(case), "--step-model", model,
                            "--arms", "stock", "--out", str(out), "--no-trace")
        assert result.returncode == 0, result.stderr
        assert "engine: " in result.stdout
        runs[name] = json.loads((out / "config.json").read_text())["engine"]
    h100, cpu = runs["h100"], runs["cpu"]
    assert (h100["max_num_batched_tokens"], h100["max_num_seqs"], h100["block_size"],
            h100["async_scheduling"], h100["max_model_len"]) == (8192, 1024, 16, True, 40960)
    assert set(h100["sources"].values()) == {"vLLM's on H100 SXM"}
    assert (cpu["max_num_batched_tokens"], cpu["max_num_seqs"], cpu["block_size"],
            cpu["async_scheduling"], cpu["max_model_len"]) == (256, 256, 128, False, 4096)
    given = _fairsched("simulate", "--case", str(case), "--step-model",
                       "analytic:h100:qwen3-8b", "--arms", "stock", "--no-trace",
                       "--out", str(tmp_path / "given"), "--max-num-batched-tokens", "2048",
                       "--no-async-scheduling")
    assert given.returncode == 0, given.stderr
    engine = json.loads((tmp_path / "given" / "config.json").read_text())["engine"]
    assert (engine["max_num_batched_tokens"], engine["async_scheduling"]) == (2048, False)
    assert engine["sources"]["max_num_batched_tokens"] == "given"
    assert engine["sources"]["max_num_seqs"] == "vLLM's on H100 SXM"
