"""Packaging: the base install runs the scheduler without ONNX Runtime; the sdist holds
what its wheel build needs and the package data; sdist and wheel pass ``twine check``; the
wheel built from the sdist works in a fresh virtual environment that holds only vLLM, where
vLLM finds both plugins and ``fairsched check-config`` runs.

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
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from engine_flags import EAGER
from wheel_venv import build_dists, fresh_venv, without_pythonpath

import fairsched_plugin

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
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """The sdist and the wheel built from it: one build for every check of this module."""
    return build_dists(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory, dists) -> str:
    """A fresh venv holding the project venv's vLLM (through links) and the wheel."""
    return fresh_venv(tmp_path_factory.mktemp("wheel"), sys.executable, dists[1])


def _package_files() -> set[str]:
    """Every file of the package in this checkout, as a path inside the wheel."""
    package = ROOT / "fairsched_plugin"
    return {path.relative_to(ROOT).as_posix() for path in package.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


@pytest.mark.slow
def test_the_sdist_holds_its_build_inputs_and_the_wheel_every_package_file(dists):
    """The wheel was built from the sdist (build_dists), so the sdist held setup.py's
    entry_points.toml; both hold every file of the package, the traces in data/ included."""
    sdist, wheel = dists
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        in_sdist = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
        [declared] = [name for name in in_wheel if name.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(declared).decode()
    package = _package_files()
    assert {"fairsched_plugin/data/azure_conv_2023.csv",
            "fairsched_plugin/data/README.md"} <= package
    assert {"entry_points.toml", "setup.py", "pyproject.toml", "README.md"} <= in_sdist
    assert package - in_sdist == set(), "missing from the sdist"
    assert package - in_wheel == set(), "missing from the wheel"
    for group, target in [("console_scripts", "fairsched_plugin.cli:main"),
                          ("vllm.general_plugins", "fairsched_plugin.plugin:register"),
                          ("vllm.endpoint_plugins",
                           "fairsched_plugin.metrics.live_view:LiveView")]:
        assert f"[{group}]\nfairsched = {target}\n" in entry_points


@pytest.mark.slow
def test_sdist_and_wheel_pass_twine_check(dists):
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                             *map(str, dists)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


@pytest.mark.slow
def test_the_version_is_stated_once(dists, wheel_venv):
    """pyproject.toml reads fairsched_plugin.__version__; the built files and the installed
    metadata carry it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    version = fairsched_plugin.__version__
    assert [path.name for path in dists] == [f"fairsched_plugin-{version}.tar.gz",
                                             f"fairsched_plugin-{version}-py3-none-any.whl"]
    out = subprocess.run([wheel_venv, "-c", "import importlib.metadata as m, fairsched_plugin; "
                          "print(m.version('fairsched-plugin'), fairsched_plugin.__version__)"],
                         capture_output=True, text=True, env=without_pythonpath(), check=False)
    assert out.stdout.split() == [version, version], out.stderr[-2000:]


_FIND_PLUGINS = """
import importlib.metadata as m, json
from vllm.plugins import load_plugins_by_group
groups = ("vllm.general_plugins", "vllm.endpoint_plugins")
declared = {g: {e.name: e.value for e in m.entry_points(group=g)} for g in groups}
loaded = {g: load_plugins_by_group(g).get("fairsched") for g in groups}
print(json.dumps({"declared": declared,
                  "loaded": {g: f"{p.__module__}:{p.__qualname__}" if p else None
                             for g, p in loaded.items()}}))
"""


@pytest.mark.slow
def test_vllm_finds_both_plugins_of_the_wheel(wheel_venv, tmp_path):
    """Through importlib.metadata and through vLLM's own loader (every plugin loaded, as
    when VLLM_PLUGINS is unset)."""
    env = {k: v for k, v in without_pythonpath().items() if k != "VLLM_PLUGINS"}
    out = subprocess.run([wheel_venv, "-c", _FIND_PLUGINS], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    expected = {"vllm.general_plugins": "fairsched_plugin.plugin:register",
                "vllm.endpoint_plugins": "fairsched_plugin.metrics.live_view:LiveView"}
    assert {g: names.get("fairsched") for g, names in found["declared"].items()} == expected
    assert found["loaded"] == expected


@pytest.mark.slow
def test_check_config_runs_from_the_wheel(wheel_venv, tmp_path):
    fairsched = str(Path(wheel_venv).parent / "fairsched")
    env = {k: v for k, v in without_pythonpath().items() if not k.startswith("FAIRSCHED_")}

    def check(config: dict) -> subprocess.CompletedProcess:
        return subprocess.run([fairsched, "check-config", "--additional-config",
                               json.dumps({"fairsched": config})], capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=300, check=False)

    accepted = check({"policy": "aging"})
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "start-up would accept it" in accepted.stdout
    assert re.search(r"policy = aging\s+\(--additional-config\)", accepted.stdout)
    assert re.search(r"vLLM \S+: in the tested range", accepted.stdout), accepted.stdout
    refused = check({"policy": "no-such-policy"})
    assert refused.returncode == 1 and "no-such-policy" in refused.stderr, refused.stderr


@pytest.mark.slow
def test_the_wheel_runs_the_scheduler_without_onnxruntime(wheel_venv, tmp_path):
    env = without_pythonpath()
    out = _run(wheel_venv, tmp_path, {"policy": "aging"}, env)
    assert "BUILT FairSyncScheduler" in out and "ONNXRUNTIME_LOADED False" in out
    out = _run(wheel_venv, tmp_path, {"policy": "fcfs", "lprs": {"enabled": True},
                                      "predictor": {"path": str(tmp_path / "m.onnx")}}, env)
    assert "ERROR PredictorError" in out
    assert "needs ONNX Runtime, which is not installed" in out
    assert "fairsched_plugin-VERSION-py3-none-any.whl[predictor]" in out


@pytest.mark.slow
def test_the_wheel_ships_the_azure_trace_with_its_attribution(wheel_venv):
    out = subprocess.run([wheel_venv, "-c", """
from fairsched_plugin.experiment.traces import read_trace, resolve
print(len(read_trace("azure-conv")), "Splitwise" in (resolve("azure-conv").parent / "README.md").read_text())
"""], capture_output=True, text=True, env=without_pythonpath(), check=False)
    assert out.stdout.split() == ["19366", "True"], out.stderr[-2000:]


@pytest.mark.slow
def test_a_server_starts_from_the_wheel(wheel_venv, tiny_model, tmp_path, monkeypatch):
    """``--scheduler-cls`` with the default policy; the wheel switched on by
    ``FAIRSCHED_POLICY`` alone is test_vllm_versions_e2e's (on vLLM 0.27.1), and the
    environment route on this vLLM is test_server_e2e's."""
    from fairsched_plugin.bench.openai_stream import stream_completion
    from fairsched_plugin.bench.server import running_server

    args = ["--max-model-len", "1024", "--max-num-batched-tokens", "256", "--dtype", "float32",
            *EAGER, "--scheduler-cls", "fairsched_plugin.FairScheduler"]
    # Outside the checkout, so ``python -m`` cannot import fairsched from the working tree.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with running_server(str(tiny_model), tmp_path / "server.log", args,
                        python=wheel_venv) as server:
        result = stream_completion(server.base_url, server.model, "Hello there " * 10, 8)
        log = server.log_text()
    assert result.completion_tokens == 8
    assert re.search(r"fairsched: scheduler Fair(Sync)?Scheduler active with policy "
                     r"guarded-srpf", log), log[-3000:]
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
    assert "pip install '.[predictor]' in a checkout" in message


def test_a_missing_onnxruntime_names_the_extras(monkeypatch):
    from fairsched_plugin.predictor.runtime import PredictorError, onnxruntime

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ModuleNotFoundError
    with pytest.raises(PredictorError, match=r"needs ONNX Runtime, which is not installed; "
                                             r"install the 'predictor' extra.*"
                                             r"py3-none-any\.whl\[predictor\]' from a wheel"):
        onnxruntime()
