"""Disaggregated prefill on the CPU build: the plugin's scheduler on the prefill server.

Two real servers on the tiny model share vLLM's ``ExampleConnector`` (a directory of
safetensors files, the only connector in vLLM that moves KV between servers without NIXL,
LMCache, Mooncake or a GPU): a producer (``kv_producer``) running the plugin with its
default policy, and a consumer (``kv_consumer``) running stock vLLM. An in-process proxy
does what vLLM's disaggregated proxies do: each completion goes first to the producer with
``max_tokens`` 1, which prefills it and writes its KV cache, then as sent to the consumer,
which loads that KV and decodes, streamed back to the client.

Twelve streamed requests of distinct prompts, 40 to 900 tokens, go through the proxy at
once; four are cancelled mid-stream. Checked: every other request streams exactly its
``max_tokens`` tokens; the consumer loaded from the connector exactly the whole KV blocks
the connector promises for every prompt (its ``vllm:external_prefix_cache_hits`` and the
KV files on disk), so the decode side did not prefill the prompts itself; both servers
drain to no running and no waiting request; the cancelled requests were cut short on the
consumer (it generated fewer tokens than asked); and the servers are stopped whatever
happens.

The producer runs with chunked prefill off (``--no-enable-chunked-prefill``, a budget of
``max_model_len``): ``ExampleConnector`` writes a request's KV once, in the step that
first schedules it, covering only the blocks allocated by then. A prompt prefilled in
chunks leaves a short file, and the consumer's load of it fails a shape check and kills
the consumer's engine (``inject_kv_into_layer`` in ``example_connector.py``), on any
device. The plugin runs its default there with LPRS and APC asked for (as a fitted
latency model turns them on): with chunked prefill off it turns LPRS, APC and chunk
alignment off (they size prefill chunks, and a split prompt would kill the
consumer), which its start-up log says. The file sizes below check that no prompt was
split.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from safetensors import safe_open  # noqa: E402

from fairsched_plugin.bench.openai_stream import (  # noqa: E402
    StreamedCompletion,
    sse_payloads,
    stream_completion,
    streamed_completion_body,
)
from fairsched_plugin.bench.server import ServerHandle, start, stop, wait_ready  # noqa: E402
from engine_flags import EAGER  # noqa: E402

pytestmark = pytest.mark.slow

BLOCK, MAX_LEN, KV_BLOCKS = 32, 1024, 256
"""256 blocks hold 8 requests (``--max-num-seqs``) of ``MAX_LEN`` tokens: no preemption,
which ``ExampleConnector`` cannot resume from (it would look the KV up under the prompt
and the generated tokens)."""
COMMON_ARGS = ["--max-model-len", str(MAX_LEN), "--max-num-seqs", "8", "--dtype", "float32",
               "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(KV_BLOCKS),
               "--enable-prompt-tokens-details", *EAGER]
PRODUCER_ARGS = COMMON_ARGS + ["--max-num-batched-tokens", str(MAX_LEN),
                               "--no-enable-chunked-prefill",
                               "--scheduler-cls", "fairsched_plugin.FairScheduler",
                               # LPRS and APC asked for, as with a fitted latency model:
                               # with chunked prefill off they must stay off.
                               "--additional-config",
                               '{"fairsched": {"lprs": {"enabled": true}, '
                               '"apc": {"enabled": true}}}']
CONSUMER_ARGS = COMMON_ARGS + ["--max-num-batched-tokens", "256"]

PROMPT_LENGTHS = [40, 70, 100, 150, 200, 260, 330, 400, 500, 600, 750, 900]
CANCELLED = {1, 5, 9, 10}
MAX_TOKENS, CANCELLED_MAX_TOKENS, CANCEL_AFTER_CHUNKS = 12, 400, 3


Pair = tuple[ServerHandle, ServerHandle]


def _kv_config(role: str, storage: Path) -> list[str]:
    return ["--kv-transfer-config", json.dumps({
        "kv_connector": "ExampleConnector", "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(storage)}})]


def _prompts() -> list[list[int]]:
    """Distinct token ids from the first on: no prompt is a prefix of another, so each
    consumer hit comes from the connector, not from its own prefix cache."""
    rng = random.Random(7)
    return [[100 + i] + [rng.randrange(200, 8000) for _ in range(n - 1)]
            for i, n in enumerate(PROMPT_LENGTHS)]


def connector_tokens(prompt_tokens: int) -> int:
    """Tokens ``ExampleConnector`` saves and loads for a prompt: the whole blocks of all
    but its last token, less one block when they end exactly on a boundary
    (``align_to_block_size(len - 1)`` in ``example_connector.py``)."""
    return (prompt_tokens - 2) // BLOCK * BLOCK


class _Proxy(BaseHTTPRequestHandler):
    """``POST /v1/completions``: prefill on the producer with ``max_tokens`` 1, then the
    request as sent to the consumer, its stream copied back; a client that hangs up
    closes the consumer's stream too, which aborts the request there."""

    producer = consumer = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prefill = {**body, "max_tokens": 1, "stream": False}
        prefill.pop("stream_options", None)
        try:
            _post(self.producer, prefill).close()
            upstream = _post(self.consumer, body)
        except urllib.error.HTTPError as exc:
            self.send_error(502, f"upstream answered {exc.code}")
            return
        with upstream:
            self.send_response(200)
            self.send_header("Content-Type", upstream.headers.get("Content-Type", ""))
            self.end_headers()
            try:
                for line in upstream:
                    self.wfile.write(line)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass


def _post(base_url: str, body: dict):
    request = urllib.request.Request(base_url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=300)


@contextmanager
def running_proxy(producer: str, consumer: str) -> Iterator[str]:
    handler = type("Proxy", (_Proxy,), {"producer": producer, "consumer": consumer})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def running_pair(model: str, storage: Path, logs: Path) -> Iterator[Pair]:
    """Producer and consumer, started together and waited for together; both stopped
    on the way out, whatever happened."""
    with ExitStack() as stack:
        producer = start(model, logs / "producer.log",
                         PRODUCER_ARGS + _kv_config("kv_producer", storage))
        stack.callback(stop, producer)
        consumer = start(model, logs / "consumer.log",
                         CONSUMER_ARGS + _kv_config("kv_consumer", storage))
        stack.callback(stop, consumer)
        wait_ready(producer, 600)
        wait_ready(consumer, 600)
        yield producer, consumer


def _cancel_mid_stream(base_url: str, model: str, prompt: list[int]) -> int:
    """Chunks read before the client hangs up."""
    body = streamed_completion_body(model, prompt, CANCELLED_MAX_TOKENS)
    chunks = 0
    with _post(base_url, body) as response:
        for payload in sse_payloads(response):
            chunks += bool(payload.get("choices"))
            if chunks == CANCEL_AFTER_CHUNKS:
                return chunks
    return chunks


def _send(base_url: str, model: str, i: int, prompt: list[int]) -> StreamedCompletion | int:
    if i in CANCELLED:
        return _cancel_mid_stream(base_url, model, prompt)
    return stream_completion(base_url, model, prompt, MAX_TOKENS, timeout_s=300)


def _metrics(base_url: str) -> dict[str, float]:
    """Each sample's value by name, summed over labels."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=30).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def _drained(server: ServerHandle, timeout_s: float = 30.0) -> tuple[float, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        values = _metrics(server.base_url)
        counts = (values["vllm:num_requests_running"], values["vllm:num_requests_waiting"])
        if counts == (0, 0) or time.monotonic() > deadline:
            return counts
        time.sleep(0.5)


def test_plugin_prefills_for_a_stock_decode_server(tiny_model: Path, tmp_path: Path):
    storage = tmp_path / "kv"
    storage.mkdir()
    prompts = _prompts()
    with running_pair(str(tiny_model), storage, tmp_path) as (producer, consumer), \
            running_proxy(producer.base_url, consumer.base_url) as proxy:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            results = list(pool.map(_send, [proxy] * len(prompts),
                                    [producer.model] * len(prompts),
                                    range(len(prompts)), prompts))
        drained = _drained(producer), _drained(consumer)
        consumed = _metrics(consumer.base_url)
        producer_log, consumer_log = producer.log_text(), consumer.log_text()

    assert "fairsched: scheduler FairSyncScheduler active with policy guarded-srpf" in producer_log
    assert "chunked prefill is off, so LPRS, APC and chunk alignment are off" in producer_log
    assert "Traceback" not in producer_log + consumer_log
    for i, result in enumerate(results):
        if i in CANCELLED:
            assert result == CANCEL_AFTER_CHUNKS, f"request {i} ended before it was cancelled"
        else:
            assert isinstance(result, StreamedCompletion)
            assert result.completion_tokens == MAX_TOKENS, f"request {i}: {result}"
            assert result.chunks > 1
    assert drained == ((0, 0), (0, 0)), "a server kept running or waiting requests"

    # The consumer loaded each prompt's whole blocks from the connector, and computed
    # only the rest itself.
    loaded = [connector_tokens(n) for n in PROMPT_LENGTHS]
    assert consumed["vllm:external_prefix_cache_hits_total"] == sum(loaded)
    assert consumed["vllm:prompt_tokens_cached_total"] == sum(loaded)
    # One directory per prompt, each layer's file holding every promised token: the
    # producer prefilled each prompt in one step (a split prompt leaves a short file).
    folders = sorted(storage.iterdir())
    assert len(folders) == len(prompts)
    saved = []
    for folder in folders:
        with safe_open(str(folder / "model.layers.0.self_attn.attn.safetensors"), "pt") as f:
            saved.append(f.get_slice("kv_cache").get_shape()[0])
    assert sorted(saved) == sorted(loaded)
    # The cancelled requests stopped on the consumer, far short of what they asked for.
    asked = MAX_TOKENS * (len(prompts) - len(CANCELLED)) + CANCELLED_MAX_TOKENS * len(CANCELLED)
    assert consumed["vllm:generation_tokens_total"] < asked - len(CANCELLED) * 100
