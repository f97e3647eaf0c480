"""Replay a workload case against any OpenAI-compatible server.

Every request is sent at its scheduled offset as a streamed ``/v1/completions`` call with
``max_tokens`` = its target output length and ``ignore_eos``, so every policy does the same
work. Per request it records when it was sent, when the first token and the last chunk
arrived, how many tokens came back and any error, in seconds since the run started (wall
clock, so the server's trace can be joined). A failed or timed-out request is recorded
and counted; it never ends the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from tqdm import tqdm

from .openai_stream import sse_payload, streamed_completion_body
from ..experiment.stand_in_tokens import prompt_token_ids


@dataclass
class RequestResult:
    """What the client saw of one request; times in seconds from the run start."""

    id: str
    category: str
    tier: int
    prompt_tokens: int
    target_output_tokens: int
    arrival_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0
    error: str | None = None
    cached_tokens: int | None = None
    """Prompt tokens the server found in its prefix cache (its usage's
    ``prompt_tokens_details``, which ``vllm serve`` reports with
    ``--enable-prompt-tokens-details``); None when it does not say."""
    # The JSON key is "class"; a Python attribute cannot be.
    request_class: str = ""

    @classmethod
    def for_case(cls, case: Any) -> RequestResult:
        """The record of one case request (a ``case_files.WorkloadRequest``), not yet sent."""
        return cls(id=case.id, category=case.category, tier=case.tier,
                   prompt_tokens=case.prompt_tokens, target_output_tokens=case.output_tokens,
                   arrival_s=case.arrival_s, request_class=case.request_class)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["class"] = data.pop("request_class")
        return data


@dataclass(frozen=True)
class ReplayResult:
    start_wall: float
    requests: list[RequestResult]


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    case: Any,
    start: float,
    timeout_s: float,
    progress: tqdm,
) -> RequestResult:
    result = RequestResult.for_case(case)
    await asyncio.sleep(max(0.0, start + case.arrival_s - time.time()))
    body = {**streamed_completion_body(model, _prompt(case), case.output_tokens),
            "priority": case.tier}
    result.sent_s = time.time() - start
    chunks = 0
    try:
        async with session.post(
            url,
            json=body,
            headers={"X-Request-Id": case.id},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            async for raw in response.content:
                payload = sse_payload(raw)
                if payload is None:
                    continue
                if any(choice.get("text") for choice in payload.get("choices", [])):
                    chunks += 1
                    if result.first_token_s is None:
                        result.first_token_s = time.time() - start
                usage = payload.get("usage")
                if usage:
                    result.output_tokens = usage.get("completion_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        result.cached_tokens = details["cached_tokens"]
        result.finish_s = time.time() - start
        if result.output_tokens == 0:
            result.output_tokens = chunks
        if result.output_tokens != case.output_tokens:
            result.error = f"got {result.output_tokens} tokens, asked for {case.output_tokens}"
    except asyncio.TimeoutError:
        result.error = f"timed out after {timeout_s:.0f} s"
    except (aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        progress.update(1)
    return result


def _prompt(case: Any) -> str | list[int]:
    """The case's prompt text; for a case that names its shared blocks and has no text,
    its stand-in token ids, which share exactly what the blocks share (the simulator
    feeds the same ids to its cache)."""
    if case.prompt or not getattr(case, "blocks", ()):
        return case.prompt
    return prompt_token_ids(case)


async def _replay(
    base_url: str, model: str, cases: Sequence[Any], timeout_s: float, show_progress: bool
) -> ReplayResult:
    connector = aiohttp.TCPConnector(limit=0)
    # disable=None: a bar on a terminal, nothing in a log file.
    with tqdm(total=len(cases), desc="replay", unit="req",
              disable=None if show_progress else True) as bar:
        async with aiohttp.ClientSession(connector=connector) as session:
            start = time.time()
            results = await asyncio.gather(
                *(
                    _one(session, base_url + "/v1/completions", model, case, start, timeout_s, bar)
                    for case in cases
                )
            )
    return ReplayResult(start_wall=start, requests=list(results))


def replay(
    base_url: str,
    model: str,
    cases: Iterable[Any],
    *,
    timeout_s: float = 600.0,
    show_progress: bool = True,
) -> ReplayResult:
    """Send every case at its offset; return when all have finished, failed or timed out.

    ``cases`` are workload requests (``id``, ``arrival_s``, ``prompt``, ``prompt_tokens``,
    ``output_tokens``, ``tier``, ``request_class``, ``category``).
    """
    ordered = sorted(cases, key=lambda case: case.arrival_s)
    return asyncio.run(_replay(base_url.rstrip("/"), model, ordered, timeout_s, show_progress))
