"""The file an engine's scheduler writes its fairsched metrics to, and how it is read.

vLLM runs the scheduler in the engine-core process and serves ``/metrics`` from the API
server's process; vLLM's ``SchedulerStats`` cross between them with a fixed set of fields,
so nothing of the plugin's can ride along. Each engine core therefore writes its
cumulative counters and its current queue, as one JSON document, to a file named by the
launch's ``VllmConfig.instance_id`` (the same object, pickled, in both processes) and its
data-parallel index; the API server reads every engine's file when it is scraped. A
snapshot is replaced atomically, so a reader sees the last complete one.

The document (``version`` 1):

- ``time`` (wall clock of the snapshot), ``engine`` (int), ``model_name``;
- ``policy``: ``name``, ``description`` (the start-up line's), ``settings`` (dotted key ->
  value as text, the keys that differ from the defaults);
- ``class_edges``: prompt-token edges of the request classes (``short`` below the first,
  ``medium`` up to the second, ``long`` above);
- ``wait_buckets``, ``lateness_buckets``, ``error_buckets``: histogram upper bounds;
- ``queue_wait``: a list of ``{"class", "tier", "counts", "sum"}``, ``counts`` per bucket
  (not cumulative) with one more for +Inf: the time from arrival to the first step that
  schedules the request;
- ``abandoned``: a list of ``{"class", "tier", "count"}``: requests finished (aborted)
  before any step scheduled them;
- ``reordered``: requests first scheduled while an earlier arrival was still waiting;
- ``overdue``: ``{"count", "counts", "sum"}`` for requests first scheduled after their
  guard deadline, and how late (seconds); absent for policies without a guard;
- ``alpha``: Aging's current alpha (null while uncalibrated); absent without Aging;
- ``tail_watch``: ``{"gain", "step_backs", "tail_ratio"}``: the guard's gain on its slack
  and allowance, how often its tail watch lowered it, and the served tail over FCFS's at
  its last judgement; absent without the watch;
- ``lprs``: ``{"falling_back", "fallback_steps": {reason: n}, "error": {"counts",
  "sum"}, "target_ms", "bias_ms"}``, ``error`` the relative error |measured - predicted| /
  measured of each dispatched batch, ``target_ms`` null while an automatic target is not
  predicted yet; absent without LPRS;
- ``apc``: outcome -> count of APC's decisions; absent without APC;
- ``failures``: place -> count of steps that ran as stock vLLM because the plugin's work
  failed there;
- ``queue``: class -> ``{"waiting", "prompt_tokens", "oldest_wait_s"}`` for requests not
  yet scheduled;
- ``steps``: engine steps scheduled.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SNAPSHOT_VERSION = 1


def snapshot_dir(base: str | None) -> Path:
    """``metrics.dir`` when set, else a folder in the system's temporary directory."""
    return Path(base) if base else Path(tempfile.gettempdir()) / "fairsched-metrics"


def snapshot_path(base: str | None, instance_id: str, engine: int) -> Path:
    return snapshot_dir(base) / f"{instance_id}-engine{engine}.json"


def write_snapshot(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` with ``document`` in one step (write beside it, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_snapshots(base: str | None, instance_id: str) -> list[dict[str, Any]]:
    """Every engine's last snapshot for this launch, by engine index; a file that cannot
    be read or parsed (an engine that never stepped, a foreign file) is skipped."""
    documents = []
    for path in sorted(snapshot_dir(base).glob(f"{instance_id}-engine*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(document, dict) and document.get("version") == SNAPSHOT_VERSION:
            documents.append(document)
    return sorted(documents, key=lambda d: d.get("engine", 0))
