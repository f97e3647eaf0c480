"""One streamed OpenAI completion, timed: the smallest client that proves a server works."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamedCompletion:
    text: str
    chunks: int
    ttft_s: float
    e2e_s: float
    finish_reason: str | None
    completion_tokens: int | None


def streamed_completion_body(model: str, prompt: str | list[int], max_tokens: int) -> dict:
    """A ``/v1/completions`` request for exactly ``max_tokens`` streamed tokens, with a
    final usage chunk that says how many came."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


def sse_payload(raw: bytes) -> dict | None:
    """The JSON payload of one server-sent-event line; None for any other line and for
    the closing ``data: [DONE]``."""
    line = raw.decode("utf-8").strip()
    if not line.startswith("data:"):
        return None
    data = line[len("data:"):].strip()
    return None if data == "[DONE]" else json.loads(data)


def sse_payloads(lines: Iterable[bytes]) -> Iterator[dict]:
    """JSON payloads of a server-sent-event stream."""
    for raw in lines:
        payload = sse_payload(raw)
        if payload is not None:
            yield payload


def stream_completion(
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    timeout_s: float = 600.0,
    extra_body: dict | None = None,
) -> StreamedCompletion:
    """POST ``/v1/completions`` with ``stream`` and ``ignore_eos``; time the first chunk."""
    body = {**streamed_completion_body(model, prompt, max_tokens), **(extra_body or {})}
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    first = None
    pieces: list[str] = []
    finish_reason = None
    completion_tokens = None
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        for payload in sse_payloads(response):
            for choice in payload.get("choices", []):
                if choice.get("text"):
                    first = first if first is not None else time.perf_counter()
                    pieces.append(choice["text"])
                finish_reason = choice.get("finish_reason") or finish_reason
            usage = payload.get("usage")
            if usage:
                completion_tokens = usage.get("completion_tokens")
    end = time.perf_counter()
    return StreamedCompletion(
        text="".join(pieces),
        chunks=len(pieces),
        ttft_s=(first if first is not None else end) - start,
        e2e_s=end - start,
        finish_reason=finish_reason,
        completion_tokens=completion_tokens,
    )
