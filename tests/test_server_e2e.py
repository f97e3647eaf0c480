"""End to end: a real OpenAI-compatible vLLM server on the tiny model, with fairsched.

Each test starts its own server (about a minute on 2 cores) and always stops it.
"""

from __future__ import annotations

import itertools
import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from fairsched_plugin.bench.openai_stream import stream_completion  # noqa: E402
from fairsched_plugin.bench.server import run_until_exit, running_server  # noqa: E402
from engine_flags import EAGER  # noqa: E402

pytestmark = pytest.mark.slow

ENGINE_ARGS = ["--max-model-len", "2048", "--max-num-batched-tokens", "256", "--dtype", "float32",
               *EAGER]
PROMPTS = [
    "How do I make a good cup of coffee at home?",
    "Write a short poem about the sea. " * 20,
    "Explain chunked prefill in one paragraph.",
    "List three uses of a heap data structure. " * 40,
]


def _query_all(server, max_tokens: int = 16):
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(
            stream_completion,
            itertools.repeat(server.base_url),
            itertools.repeat(server.model),
            PROMPTS,
            itertools.repeat(max_tokens),
        ))


def _assert_streamed(results, max_tokens: int = 16) -> None:
    for result in results:
        assert result.completion_tokens == max_tokens
        assert result.chunks > 1, "the completion must arrive as a stream"
        assert result.text
        assert 0 < result.ttft_s <= result.e2e_s


def test_scheduler_cls_serves_with_the_default_policy(tiny_model: Path, tmp_path: Path):
    args = ENGINE_ARGS + [
        "--scheduler-cls", "fairsched_plugin.FairScheduler",
        "--additional-config", json.dumps({"fairsched": {"guarded_srpf": {"slack": 1.5}}}),
    ]
    with running_server(str(tiny_model), tmp_path / "server.log", args) as server:
        _assert_streamed(_query_all(server))
        metrics = urllib.request.urlopen(server.base_url + "/metrics", timeout=30).read().decode()
        log = server.log_text()
    # The guard's tail watch: fewer requests than its first judgement needs, so it still
    # serves them in arrival order (gain 0) and has not stepped back.
    assert re.search(r"^fairsched:guard_gain\{[^}]*\} 0\.0$", metrics, re.M), metrics[-2000:]
    assert re.search(r"^fairsched:guard_step_backs_total\{[^}]*\} 0\.0$", metrics, re.M)
    # The CPU executor runs vLLM without async scheduling, so FairScheduler builds its
    # sync variant; on a GPU the same name stays async.
    assert re.search(
        r"fairsched: scheduler Fair(Sync)?Scheduler active with policy "
        r"guarded-srpf\(shortest remaining prefill first; "
        r"due after slack=1.5 x the FCFS backlog \+ 1 x its own prefill, passed only "
        r"while EDF stays feasible; stepped back towards arrival order while the TTFT or "
        r"TPOT tail of the last 200 requests is longer than FCFS's\) \(vLLM",
        log,
    )
    assert "is the async variant" not in log


def test_environment_alone_switches_it_on(tiny_model: Path, tmp_path: Path):
    env = {"FAIRSCHED_POLICY": "aging", "FAIRSCHED_AGING_ALPHA": "150",
           "FAIRSCHED_DECODE_SHARE": "0.3", "FAIRSCHED_DECODE_SHARE_MAX_TPOT_MS": "150",
           "FAIRSCHED_LPRS_ENABLED": "true", "FAIRSCHED_APC_ENABLED": "true"}
    with running_server(str(tiny_model), tmp_path / "server.log", ENGINE_ARGS, env=env) as server:
        _assert_streamed(_query_all(server))
        log = server.log_text()
    assert "FAIRSCHED_POLICY=aging and no --scheduler-cls: using fairsched_plugin.FairScheduler" in log
    assert ("active with policy aging(alpha=150, beta=-1), LPRS (target: the predicted "
            "time of a 256-token prefill step, not predicted yet), APC (at "
            "most 8 prefills), decodes held to 76 per step "
            "while prefill work waits (decode_share=0.3), none held beyond 150 ms per "
            "output token") in log


@pytest.mark.parametrize(
    ("extra_args", "env", "message"),
    [
        (
            ["--scheduler-cls", "fairsched_plugin.FairScheduler",
             "--additional-config", '{"fairsched": {"aging": {"alpha": -1}}}'],
            {},
            "aging.alpha from --additional-config 'fairsched' must be a finite number > 0",
        ),
        (
            [],
            {"FAIRSCHED_POLICY": "aging", "FAIRSCHED_AGING_ALFA": "3"},
            "unknown environment variable FAIRSCHED_AGING_ALFA",
        ),
    ],
    ids=["additional-config", "environment"],
)
def test_bad_config_stops_start_up(tiny_model: Path, tmp_path: Path, extra_args, env, message):
    code, log = run_until_exit(
        str(tiny_model), tmp_path / "server.log", ENGINE_ARGS + extra_args, env=env
    )
    assert code not in (0, None), "the server must exit by itself, with an error"
    assert message in log
    # Stopped by the launch check in the API server, before an engine core started.
    assert "EngineCore" not in log and "load model" not in log.lower()


def _closed_loop_client(server, prompt: str, requests: int, tag: str) -> list[float]:
    """``requests`` completions of one output token, each sent when the last has
    answered; the first block of each prompt differs, so the prefix cache finds nothing."""
    return [stream_completion(server.base_url, server.model, f"{tag} {i}. {prompt}", 1).ttft_s
            for i in range(requests)]


def test_the_default_steps_back_on_a_real_server_when_its_order_harms_the_tail(
        tiny_model: Path, tmp_path: Path):
    # Two clients send long prompts and four send short ones, each waiting for its answer
    # before the next. Once the watch lets short prompts ahead, every long prompt waits
    # behind the short ones that arrive during its prefill, up to its deadline: longer
    # than FCFS would have kept it, so the tail is harmed and the guard steps back.
    config = {"fairsched": {"guarded_srpf": {"tail_window": 8}}}
    args = ENGINE_ARGS + ["--scheduler-cls", "fairsched_plugin.FairScheduler",
                          "--additional-config", json.dumps(config)]
    long_prompt = "The history of the heap data structure. " * 170
    short_prompt = "Explain chunked prefill in one paragraph. " * 6
    clients = [(long_prompt, 10, f"long{c}") for c in range(2)] + [
        (short_prompt, 40, f"short{c}") for c in range(4)]
    with running_server(str(tiny_model), tmp_path / "server.log", args) as server:
        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            waits = list(pool.map(lambda spec: _closed_loop_client(server, *spec), clients))
        metrics = urllib.request.urlopen(server.base_url + "/metrics", timeout=30).read().decode()
        log = server.log_text()
    assert all(len(w) == n for w, (_, n, _) in zip(waits, clients))
    step_backs = re.search(r"^fairsched:guard_step_backs_total\{[^}]*\} (\S+)$", metrics, re.M)
    assert step_backs and float(step_backs.group(1)) >= 1, metrics[-3000:]
    assert "so the guard steps back towards arrival order" in log
    gain = re.search(r"^fairsched:guard_gain\{[^}]*\} (\S+)$", metrics, re.M)
    assert gain and 0 <= float(gain.group(1)) <= 1
