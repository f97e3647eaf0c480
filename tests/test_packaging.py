"""Packaging: the base install runs the scheduler without ONNX Runtime; a built wheel
works in a fresh virtual environment that holds only vLLM.

The fresh environment is a new venv whose only other packages are the project venv's,
seen through a directory of links that leaves out fairsched and ONNX Runtime (so neither
the editable checkout nor ``onnxruntime``/``onnx`` can be imported there): vLLM and its
dependencies without installing 3.5 GB again. fairsched comes from the wheel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_venv import build_wheel, fresh_venv, without_pythonpath

ROOT = Path(__file__).resolve().parent.parent

_BUILD_SCHEDULER = """
import json, sys
from pathlib import Path
from fairsched_plugin.sim.fake_engine import make_scheduler, write_config_only_model
from fairsched_plugin import FairSyncScheduler
model = write_config_only_model(Path(sys.argv[1]))
config = json.loads(sys.argv[2])
try:
    scheduler = make_scheduler(FairSyncScheduler, model, async_scheduling=False,
                               additional_config={"fairsched": config})
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
else:
    print("BUILT", type(scheduler).__name__)
print("ONNXRUNTIME_LOADED", "onnxruntime" in sys.modules)
"""


def _run(python: str, tmp_path: Path, config: dict, env: dict | None = None) -> str:
    result = subprocess.run(
        [python, "-c", _BUILD_SCHEDULER, str(tmp_path / "model"), json.dumps(config)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={k: v for k, v in (env or os.environ).items() if not k.startswith("FAIRSCHED_")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_scheduler_never_imports_onnxruntime_without_the_predictor(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = _run(sys.executable, tmp_path,
               {"policy": "aging", "apc": {"enabled": True}, "lprs": {"align": "on"}}, env)
    assert "BUILT FairSyncScheduler" in out
    assert "ONNXRUNTIME_LOADED False" in out


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> str:
    """A fresh venv holding the project venv's vLLM (through links) and the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    return fresh_venv(tmp, sys.executable, build_wheel(tmp / "dist"))


@pytest.mark.slow
def test_the_wheel_runs_the_scheduler_without_onnxruntime(wheel_venv, tmp_path):
    env = without_pythonpath()
    out = _run(wheel_venv, tmp_path, {"policy": "aging"}, env)
    assert "BUILT FairSyncScheduler" in out and "ONNXRUNTIME_LOADED False" in out
    out = _run(wheel_venv, tmp_path, {"policy": "fcfs", "lprs": {"enabled": True},
                                      "predictor": {"path": str(tmp_path / "m.onnx")}}, env)
    assert "ERROR PredictorError" in out
    assert "needs ONNX Runtime, which is not installed" in out
    assert "fairsched-plugin[predictor]" in out


@pytest.mark.slow
def test_the_wheel_ships_the_azure_trace_with_its_attribution(wheel_venv):
    out = subprocess.run([wheel_venv, "-c", """
from fairsched_plugin.bench.traces import read_trace, resolve
print(len(read_trace("azure-conv")), "Splitwise" in (resolve("azure-conv").parent / "README.md").read_text())
"""], capture_output=True, text=True, env=without_pythonpath(), check=False)
    assert out.stdout.split() == ["19366", "True"], out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scheduler-cls", "environment"])
def test_a_server_starts_from_the_wheel(wheel_venv, tiny_model, tmp_path, how, monkeypatch):
    from fairsched_plugin.bench.openai_stream import stream_completion
    from fairsched_plugin.bench.server import running_server

    args = ["--max-model-len", "1024", "--max-num-batched-tokens", "256", "--dtype", "float32"]
    # Outside the checkout, so ``python -m`` cannot import fairsched from the working tree.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env: dict[str, str] = {}
    if how == "scheduler-cls":
        args += ["--scheduler-cls", "fairsched_plugin.FairScheduler"]
    else:
        env["FAIRSCHED_POLICY"] = "aging"
    with running_server(str(tiny_model), tmp_path / "server.log", args, env=env,
                        python=wheel_venv) as server:
        result = stream_completion(server.base_url, server.model, "Hello there " * 10, 8)
        log = server.log_text()
    assert result.completion_tokens == 8
    policy = "guarded-srpf" if how == "scheduler-cls" else "aging"
    assert re.search(rf"fairsched: scheduler Fair(Sync)?Scheduler active with policy {policy}",
                     log), log[-3000:]
    assert "scheduler hooks: per-request cap through _reserve_prefill_lookahead" in log
    assert "onnxruntime" not in log.lower()


def test_the_sources_parse_as_python_3_10():
    """requires-python is >=3.10 and only 3.11 is installed here: at least the grammar
    (``except*``, ...) must be 3.10's. setup.py imports tomli there (a 3.10-only build
    requirement in pyproject.toml) instead of tomllib."""
    import ast

    files = [ROOT / "setup.py", *sorted((ROOT / "fairsched_plugin").rglob("*.py"))]
    for path in files:
        ast.parse(path.read_text(), str(path), feature_version=(3, 10))
    setup = (ROOT / "setup.py").read_text()
    assert "import tomli as tomllib" in setup
    assert "tomli>=1.1; python_version < '3.11'" in (ROOT / "pyproject.toml").read_text()


def _python_3_10() -> str | None:
    import glob
    import shutil

    candidates = [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python"))),
                  shutil.which("python3.10")]
    for candidate in filter(None, candidates):
        # A pyenv shim exists even where its version is not selected: it must run.
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.skipif(_python_3_10() is None, reason="no Python 3.10 interpreter here")
def test_the_wheel_builds_and_loads_on_python_3_10(tmp_path):
    """setup.py under 3.10 (tomli, fetched by pip's build isolation), then the package,
    its config and policies and its vLLM entry point in a 3.10 venv (no vLLM for 3.10
    here: the scheduler itself is covered on 3.11)."""
    python310 = _python_3_10()
    subprocess.run([python310, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, timeout=600, env=without_pythonpath())
    wheel = next((tmp_path / "dist").glob("fairsched_plugin-*.whl"))
    subprocess.run([*pip, "install", str(wheel)], check=True, timeout=600,
                   env=without_pythonpath())
    out = subprocess.run([python, "-c", """
import importlib.metadata as m, sys
from fairsched_plugin.config import load_config
from fairsched_plugin.policies import make_policy
config = load_config({"fairsched": {"policy": "aging", "aging": {"alpha": 2.0}}}, environ={})
print(sys.version_info[:2], make_policy(config, epoch=0.0).describe())
print([e.value for e in m.entry_points(group="vllm.general_plugins") if e.name == "fairsched"])
"""], capture_output=True, text=True, check=True, cwd=tmp_path, env=without_pythonpath()).stdout
    assert "(3, 10) aging(alpha=2, beta=-1)" in out
    assert "['fairsched_plugin.plugin:register']" in out


class _BrokenBuild:
    """A meta-path finder standing in for onnxruntime-cann 1.24 under numpy 2, whose
    import fails inside the package (faked: no such build can be installed here)."""

    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime":
            raise ImportError("numpy.core.multiarray failed to import")
        return None


def test_a_broken_onnxruntime_build_is_named_with_its_fix(monkeypatch):
    from fairsched_plugin.predictor.runtime import PredictorError, onnxruntime

    for name in [m for m in sys.modules if m == "onnxruntime" or m.startswith("onnxruntime.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_BrokenBuild(), *sys.meta_path])
    with pytest.raises(PredictorError) as info:
        onnxruntime()
    message = str(info.value)
    assert "fails to import (ImportError: numpy.core.multiarray failed to import)" in message
    assert "pip uninstall onnxruntime-cann" in message
    assert "fairsched-plugin[predictor]" in message


def test_a_missing_onnxruntime_names_the_extras(monkeypatch):
    from fairsched_plugin.predictor.runtime import PredictorError, onnxruntime

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ModuleNotFoundError
    with pytest.raises(PredictorError, match=r"needs ONNX Runtime, which is not installed.*"
                                             r"fairsched-plugin\[predictor\] \(CPU\)"):
        onnxruntime()
