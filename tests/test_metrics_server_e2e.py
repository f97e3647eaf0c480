"""The ``fairsched:`` series and ``GET /fairsched`` on a real vLLM server (tiny model).

One server with the plugin takes a burst of streamed requests of three prompt classes and
two priority tiers, some cancelled after their first token; its ``/metrics`` must count
every request exactly once (scheduled or abandoned, by class and tier), with waits no
longer than the client's own time to first token. The guard's slack is made tiny so that
requests go overdue (the exact count is checked on vLLM's scheduler with fake outputs in
``test_metrics_recorder.py``, where the steps are known), and the trace is pointed at
``/dev/full`` (a full disk) so that the plugin's own work fails every step and is counted.
A second server, stock vLLM with the package installed, must show no ``fairsched:``
series and log no error.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fairsched_plugin.bench.openai_stream import (  # noqa: E402
    sse_payloads,
    stream_completion,
    streamed_completion_body,
)
from fairsched_plugin.bench.server import running_server  # noqa: E402
from engine_flags import EAGER  # noqa: E402

pytestmark = pytest.mark.slow

STOCK_ARGS = ["--max-model-len", "2048", "--max-num-batched-tokens", "256", "--dtype",
              "float32", *EAGER]
ENGINE_ARGS = STOCK_ARGS + ["--scheduling-policy", "priority"]
PROMPT_TOKENS = {"short": 20, "medium": 300, "long": 1200}
MAX_TOKENS = 8


def _prompt(klass: str, i: int) -> list[int]:
    return [(i * 31 + j) % 500 + 10 for j in range(PROMPT_TOKENS[klass])]


def _cancel_after_first_token(base_url: str, model: str, prompt: list[int],
                              tier: int) -> float:
    """Seconds to the first token; then the connection is closed, which aborts the
    request in vLLM."""
    start = time.perf_counter()
    body = {**streamed_completion_body(model, prompt, 64), "priority": tier}
    request = urllib.request.Request(base_url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        for payload in sse_payloads(response):
            if any(choice.get("text") for choice in payload.get("choices", [])):
                return time.perf_counter() - start
    raise AssertionError("the stream ended before its first token")


def _scrape(base_url: str) -> dict[str, list]:
    text = urllib.request.urlopen(base_url + "/metrics", timeout=30).read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_metrics_count_what_the_server_did(tiny_model: Path, tmp_path: Path):
    config = {"fairsched": {
        # The guard's own order from the first request: a tail watch would start in arrival
        # order, whose requests carry no deadline to be late for.
        "guarded_srpf": {"slack": 0.01, "size_allowance": 0, "tail_window": 0, "overtake_running": True},
        "trace_path": "/dev/full",
        "metrics": {"live_view": True, "interval_s": 0.2, "dir": str(tmp_path / "metrics")},
    }}
    args = ENGINE_ARGS + ["--scheduler-cls", "fairsched_plugin.FairScheduler",
                          "--additional-config", json.dumps(config)]
    plan = [(klass, tier, cancel) for klass in PROMPT_TOKENS for tier in (0, 1)
            for cancel in (False, False, True)]
    with running_server(str(tiny_model), tmp_path / "server.log", args,
                        env={"VLLM_PLUGINS": "fairsched"}) as server:
        def send(item):
            i, (klass, tier, cancel) = item
            if cancel:
                return _cancel_after_first_token(server.base_url, server.model,
                                                 _prompt(klass, i), tier)
            return stream_completion(server.base_url, server.model, _prompt(klass, i),
                                     MAX_TOKENS, extra_body={"priority": tier})

        with ThreadPoolExecutor(max_workers=len(plan)) as pool:
            results = list(pool.map(send, enumerate(plan)))
        metrics = _scrape(server.base_url)
        status, live = _get_json(server.base_url + "/fairsched")
        log = server.log_text()

    completed = [r for r in results if not isinstance(r, float)]
    assert all(r.completion_tokens == MAX_TOKENS for r in completed)
    ttfts = [r if isinstance(r, float) else r.ttft_s for r in results]

    scheduled = {(s.labels["class"], s.labels["tier"]): s.value
                 for s in metrics["fairsched:queue_wait_seconds"]
                 if s.name == "fairsched:queue_wait_seconds_count"}
    abandoned = {(s.labels["class"], s.labels["tier"]): s.value
                 for s in metrics.get("fairsched:abandoned_requests", [])}
    sent: dict[tuple, int] = {}
    for klass, tier, _cancel in plan:
        sent[(klass, str(tier))] = sent.get((klass, str(tier)), 0) + 1
    counted = {key: scheduled.get(key, 0) + abandoned.get(key, 0) for key in sent}
    assert counted == sent

    # No request waited for the budget longer than the client waited for its first token.
    longest_ttft = max(ttfts)
    buckets: dict[float, float] = {}
    for sample in metrics["fairsched:queue_wait_seconds"]:
        if sample.name == "fairsched:queue_wait_seconds_bucket":
            le = float(sample.labels["le"])
            buckets[le] = buckets.get(le, 0) + sample.value
    bound = min(le for le in buckets if le >= longest_ttft)
    assert buckets[bound] == buckets[float("inf")] == sum(scheduled.values())
    total_wait = sum(s.value for s in metrics["fairsched:queue_wait_seconds"]
                     if s.name == "fairsched:queue_wait_seconds_sum")
    assert 0 < total_wait <= sum(ttfts)

    [overdue] = [s.value for s in metrics["fairsched:overdue_requests"]
                 if s.name == "fairsched:overdue_requests_total"]
    assert 1 <= overdue <= sum(scheduled.values())
    failures = {s.labels["place"]: s.value for s in metrics["fairsched:plugin_failures"]
                if s.name == "fairsched:plugin_failures_total"}
    assert failures.get("the step trace and its listeners", 0) >= 1
    [info] = metrics["fairsched:policy_info"]
    assert info.labels["policy"] == "guarded-srpf" and info.labels["engine"] == "0"
    assert "fairsched:guard_gain" not in metrics  # no tail watch here

    assert status == 200
    [engine] = live["engines"]
    assert engine["counts"]["scheduled"] == sum(scheduled.values())
    assert all(entry["waiting"] == 0 for entry in engine["queue"].values())
    assert "Traceback" in log  # the /dev/full trace failure, logged once with its cause


def test_stock_vllm_shows_no_fairsched_series(tiny_model: Path, tmp_path: Path):
    with running_server(str(tiny_model), tmp_path / "server.log", STOCK_ARGS) as server:
        stream_completion(server.base_url, server.model, "Hello there", MAX_TOKENS)
        text = urllib.request.urlopen(server.base_url + "/metrics", timeout=30).read().decode()
        status, _ = _get_json(server.base_url + "/fairsched")
        log = server.log_text()
    assert "vllm:time_to_first_token_seconds" in text
    assert "fairsched:" not in text
    assert status == 404
    assert "Traceback" not in log and " ERROR " not in log
