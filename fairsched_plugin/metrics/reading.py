"""A snapshot as of the moment it is read: what ``/metrics`` and ``GET /fairsched`` report.

An engine writes its snapshot at most every ``metrics.interval_s``, and not at all while
it waits for work, so a queue's oldest wait in the file is as old as the file; both views
advance it by the file's age, and both report every request class, empty or not.
"""

from __future__ import annotations

from typing import Any

from .recorder import CLASSES


def snapshot_age(document: dict[str, Any], now: float) -> float:
    """Seconds since the engine wrote ``document`` (wall clock, as ``time`` is)."""
    return now - float(document["time"])


def queue_now(document: dict[str, Any], now: float) -> dict[str, dict[str, float]]:
    """Class -> ``{"waiting", "prompt_tokens", "oldest_wait_s"}`` at ``now``: an empty
    class's oldest wait is 0, a class the document lacks is empty."""
    age = snapshot_age(document, now)
    out = {}
    for klass in CLASSES:
        entry = document["queue"].get(klass) or {}
        waiting = int(entry.get("waiting", 0))
        oldest = float(entry["oldest_wait_s"]) + age if waiting else 0.0
        out[klass] = {"waiting": waiting,
                      "prompt_tokens": int(entry.get("prompt_tokens", 0)),
                      "oldest_wait_s": oldest}
    return out
