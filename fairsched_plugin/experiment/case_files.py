"""Workload cases: the request record, the JSON Lines case file and its checks.

A case is what one benchmark run replays: one request per line, each with its arrival
offset, prompt and target output length. Every producer of cases (the named workloads in
``experiment.workloads``, the production traces in ``experiment.traces``, the sessions in
``experiment.sessions``) makes :class:`WorkloadRequest` records, and every consumer (the replay
client, vLLM's benchmark client, the simulator) takes them, from memory or from a file
:func:`read_case` checked. This module is the format both sides share, so it imports
none of them.

Case file format (JSON Lines, UTF-8, one JSON object per line and request):

- ``id``: a non-empty string, unique within the case;
- ``arrival_s``: the arrival offset in seconds, a finite number >= 0;
- ``prompt``: the prompt text (empty for a trace replayed by the simulator only);
- ``prompt_tokens`` / ``output_tokens``: integers >= 1. Prompt token counts include the
  BOS the completions endpoint adds, so they are the counts the engine reports;
  ``output_tokens`` is sent as ``max_tokens`` with ``ignore_eos``;
- ``tier``: the request's service tier, an integer;
- ``class``: the prompt class (short, medium, long) its ``prompt_tokens`` imply;
- ``category``: the workload or trace the request comes from;
- ``blocks`` and ``block_tokens``, together and only where a request has them: the names
  of its blocks of ``block_tokens`` tokens, which must cover the prompt (equal names are
  equal tokens, for the simulator's prefix cache);
- ``session`` and ``turn``, together and only where a request has them: the conversation
  it is a turn of and the turn's number (from 1).

:func:`read_case` names the file, the line and the key of the first invalid value.
:func:`write_vllm_custom` exports a case as the custom dataset ``vllm bench serve``
reads, and :func:`mean_rate` is a case's offered load.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..user_files import json_object, read_text
from .pairs import REQUEST_CLASSES, request_class

CASE_KEYS = (
    "id",
    "arrival_s",
    "prompt",
    "prompt_tokens",
    "output_tokens",
    "tier",
    "class",
    "category",
)
OPTIONAL_CASE_KEYS = ("blocks", "block_tokens", "session", "turn")
"""Written only where a request has them (a trace that names its blocks or sessions)."""


class CaseFormatError(ValueError):
    """A case line that is not a valid request; the message names the key."""


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """What a trace records of one request, and so what every case's request has too.

    ``blocks``: where the workload knows which prompts share a prefix, the names of this
    request's blocks of ``block_tokens`` tokens (the last one partial), over its prompt
    and, for a conversation's turn, its answer (the next turn repeats both): equal names
    are equal tokens, so the simulator's prefix cache hits where a real one would."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[str, ...] = ()
    block_tokens: int = 0
    session: str = ""
    """The conversation this request is a turn of (``turn``, from 1); "" for none."""
    turn: int = 0


@dataclass(frozen=True, kw_only=True)
class WorkloadRequest(RecordedRequest):
    """One request of a case. ``request_class`` is the JSON key ``class``."""

    id: str
    prompt: str
    tier: int
    request_class: str
    category: str

    def to_json(self) -> str:
        """One JSON Lines line (without the newline), keys in ``CASE_KEYS`` order."""
        record = asdict(self)
        record["class"] = record.pop("request_class")
        keys = (CASE_KEYS + (OPTIONAL_CASE_KEYS[:2] if self.blocks else ())
                + (OPTIONAL_CASE_KEYS[2:] if self.session else ()))
        return json.dumps({key: record[key] for key in keys}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> WorkloadRequest:
        """Parse and validate one line; ``CaseFormatError`` names the offending key."""
        record = json_object(text, CaseFormatError)
        missing = [key for key in CASE_KEYS if key not in record]
        if missing:
            raise CaseFormatError(f"missing key(s) {', '.join(map(repr, missing))}")
        unknown = sorted(set(record) - set(CASE_KEYS) - set(OPTIONAL_CASE_KEYS))
        if unknown:
            raise CaseFormatError(f"unknown key(s) {', '.join(map(repr, unknown))}")
        _check_case_values(record)
        return cls(
            id=record["id"],
            arrival_s=float(record["arrival_s"]),
            prompt=record["prompt"],
            prompt_tokens=record["prompt_tokens"],
            output_tokens=record["output_tokens"],
            tier=record["tier"],
            request_class=record["class"],
            category=record["category"],
            blocks=tuple(record.get("blocks", ())),
            block_tokens=record.get("block_tokens", 0),
            session=record.get("session", ""),
            turn=record.get("turn", 0),
        )


def _check_case_values(record: dict[str, Any]) -> None:
    def bad(key: str, expected: str) -> CaseFormatError:
        return CaseFormatError(f"key {key!r} must be {expected}, got {record[key]!r}")

    def is_int(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for key in ("id", "category"):
        if not (isinstance(record[key], str) and record[key]):
            raise bad(key, "a non-empty string")
    if not isinstance(record["prompt"], str):
        raise bad("prompt", "a string")
    arrival = record["arrival_s"]
    if not (is_int(arrival) or isinstance(arrival, float)) or not 0 <= arrival < math.inf:
        raise bad("arrival_s", "a finite number >= 0")
    for key in ("prompt_tokens", "output_tokens"):
        if not (is_int(record[key]) and record[key] >= 1):
            raise bad(key, "an integer >= 1")
    if not is_int(record["tier"]):
        raise bad("tier", "an integer")
    blocks, size = record.get("blocks", []), record.get("block_tokens", 0)
    if ("blocks" in record) != ("block_tokens" in record):
        raise CaseFormatError("keys 'blocks' and 'block_tokens' come together")
    if not (isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)):
        raise bad("blocks", "a list of strings")
    if "blocks" in record and not (is_int(size) and size >= 1
                                   and len(blocks) * size >= record["prompt_tokens"]):
        raise bad("block_tokens", "an integer >= 1 whose blocks cover the prompt")
    if ("session" in record) != ("turn" in record):
        raise CaseFormatError("keys 'session' and 'turn' come together")
    if "session" in record and not (isinstance(record["session"], str) and record["session"]
                                    and is_int(record["turn"]) and record["turn"] >= 1):
        raise bad("session", "a non-empty string beside an integer 'turn' >= 1")
    if record["class"] != request_class(record["prompt_tokens"]):
        raise bad("class", f"{request_class(record['prompt_tokens'])!r} for "
                           f"{record['prompt_tokens']} prompt tokens")


def write_case(path: Path, requests: Iterable[WorkloadRequest]) -> None:
    """Write a case as JSON Lines."""
    with open(path, "w", encoding="utf-8") as f:
        for request in requests:
            f.write(request.to_json() + "\n")


def read_case(path: Path) -> list[WorkloadRequest]:
    """Read and validate a case; errors name the file, the line and the key."""
    requests: list[WorkloadRequest] = []
    seen: dict[str, int] = {}
    # Lines as a file opened in text mode gives them (str.splitlines would also split at
    # a U+2028 in a prompt).
    lines = io.StringIO(read_text(path, CaseFormatError), newline=None)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = WorkloadRequest.from_json(line)
        except CaseFormatError as exc:
            raise CaseFormatError(f"{path}:{number}: {exc}") from None
        if request.id in seen:
            raise CaseFormatError(
                f"{path}:{number}: key 'id' {request.id!r} repeats line {seen[request.id]}"
            )
        seen[request.id] = number
        requests.append(request)
    return requests



# ---------------------------------------------------------------------- case figures


def case_summary(requests: Sequence[WorkloadRequest]) -> str:
    """One line: count, time span, mean rate, class counts, mean lengths."""
    if not requests:
        return "0 requests"
    span = requests[-1].arrival_s - requests[0].arrival_s
    classes = {cls: sum(r.request_class == cls for r in requests) for cls in REQUEST_CLASSES}
    rate = f"{(len(requests) - 1) / span:.2f} req/s" if span > 0 else "all at once"
    return (
        f"{len(requests)} requests over {span:.1f} s ({rate}); classes {classes}; "
        f"mean prompt {np.mean([r.prompt_tokens for r in requests]):.0f} tokens, "
        f"mean output {np.mean([r.output_tokens for r in requests]):.0f} tokens"
    )


def mean_rate(case: Sequence[WorkloadRequest]) -> float:
    """Requests per second over the case's arrival span (its offered load)."""
    span = max(r.arrival_s for r in case) - min(r.arrival_s for r in case)
    if len(case) < 2 or span <= 0:
        raise ValueError("a case needs at least two requests at different times")
    return (len(case) - 1) / span


# ------------------------------------------------------------------------- vLLM export


def vllm_custom_rows(requests: Sequence[WorkloadRequest]) -> list[dict[str, Any]]:
    """Rows for ``vllm bench serve --dataset-name custom``: it reads only the prompt and
    the output length, so arrival times and tiers do not carry over."""
    return [{"prompt": r.prompt, "output_tokens": r.output_tokens} for r in requests]


def write_vllm_custom(path: Path, requests: Sequence[WorkloadRequest]) -> int:
    """Write ``requests`` as ``vllm bench serve``'s custom dataset (JSON Lines); returns
    how many rows were written."""
    rows = vllm_custom_rows(requests)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)
