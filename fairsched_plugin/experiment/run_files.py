"""The files of a run, shared by the benchmark and the simulator: JSON Lines records, the
scheduler's per-step trace joined to the requests, and the directory name of an arm or a
case (runs are kept under ``runs/ARM/rN[/CASE]`` by both)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def case_id_of(internal_id: str, case_ids: set[str]) -> str | None:
    """The case id inside vLLM's engine id for a completion, which is
    ``cmpl-<X-Request-Id>-<choice>-<8 random characters>`` (without the random part when
    ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION`` is set). Matching against the known ids
    avoids guessing whether a numeric tail is the choice index or the random part."""
    if not internal_id.startswith("cmpl-"):
        return None
    stem = internal_id[len("cmpl-"):]
    for parts in (3, 2):
        candidate = stem.rsplit("-", parts - 1)[0]
        if candidate in case_ids:
            return candidate
    return None


def read_jsonl(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The records of a JSON Lines file from byte ``offset`` on; none if it is missing."""
    if not path.exists():
        return []
    with open(path, "rb") as file:
        file.seek(offset)
        lines = file.read().decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def join_trace(
    requests: list[dict[str, Any]], trace: list[dict[str, Any]], start_wall: float
) -> int:
    """Set ``admitted_s`` and ``prefill_done_s`` on each request from the scheduler's trace
    (seconds from the run start); returns how many requests were found in it.

    Admission is the first step that took the request from the waiting queue; prefill done
    is the end of the last step that completed its prompt (a preempted request prefills
    again after it resumes).
    """
    case_ids = {request["id"] for request in requests}
    admitted: dict[str, float] = {}
    done: dict[str, float] = {}
    for record in trace:
        for internal_id in record.get("admitted", ()):
            if (case_id := case_id_of(internal_id, case_ids)) is not None:
                admitted.setdefault(case_id, record["t"] - start_wall)
        for internal_id in record.get("prefill_done", ()):
            if (case_id := case_id_of(internal_id, case_ids)) is not None:
                done[case_id] = record["t_done"] - start_wall
    for request in requests:
        request["admitted_s"] = admitted.get(request["id"])
        request["prefill_done_s"] = done.get(request["id"])
    return sum(request["prefill_done_s"] is not None for request in requests)


def slug(name: str) -> str:
    """An arm's or case's name as a directory name: runs are kept under
    ``runs/ARM/rN[/CASE]``, by the benchmark and the simulator alike."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
