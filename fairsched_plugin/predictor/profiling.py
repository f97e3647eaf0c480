"""The profile file: one CSV row per engine step with its raw features and measured latency.

Columns: ``step``, the 11 raw features in ``RAW_FEATURES`` order, ``latency_ms``. Beside
``<file>`` a sidecar ``<file>.meta.json`` records the memory provider, the vLLM version,
the hardware, the feature names and when the file was started; training refuses to mix
files whose memory providers differ, and the model it exports carries the provider on.

The writer appends to an existing profile of the same provider, so an interrupted
profiling run can be resumed into the same file.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..user_files import read_text
from .environment import hardware_description, vllm_version
from .features import NUM_RAW, RAW_FEATURES

STEP_COLUMN = "step"
LATENCY_COLUMN = "latency_ms"
COLUMNS: tuple[str, ...] = (STEP_COLUMN, *RAW_FEATURES, LATENCY_COLUMN)


class ProfileError(ValueError):
    """A profile file that cannot be read or appended to; the message names the file."""


def meta_path(path: str | Path) -> Path:
    """The sidecar of a profile: ``<path>.meta.json``."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


class ProfileWriter:
    """Appends one row per step; line-buffered, so a killed server leaves whole rows."""

    def __init__(self, path: str | Path, memory_provider: str, meta: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        resuming = check_resumable(self.path, memory_provider)
        if not resuming:
            record = {
                **meta,
                "memory_provider": memory_provider,
                "vllm_version": vllm_version(),
                "hardware": hardware_description(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "feature_names": list(RAW_FEATURES),
            }
            meta_path(self.path).write_text(json.dumps(record, indent=2) + "\n")
        self._file: TextIO = open(self.path, "a", buffering=1, encoding="utf-8")
        if not resuming:
            self._file.write(",".join(COLUMNS) + "\n")

    def write(self, step: int, raw: np.ndarray, latency_s: float) -> None:
        """One step: its number, its raw features (11), its measured latency in seconds."""
        values = ",".join(f"{value:.10g}" for value in raw)
        self._file.write(f"{step},{values},{latency_s * 1000.0:.6f}\n")

    def close(self) -> None:
        self._file.close()


def check_resumable(path: Path, memory_provider: str | None) -> bool:
    """Whether ``path`` already holds rows, which a writer appends to. Raises
    :class:`ProfileError` when they cannot be appended to: another header, a missing or
    unreadable metadata file, or rows measured with another memory provider than
    ``memory_provider`` (not compared when None: ``fairsched check-config`` has no engine
    to ask which provider it reads)."""
    if not (path.exists() and path.stat().st_size > 0):
        return False
    _check_header(path, next(_csv_rows(path), []))
    existing = _read_meta(path)
    if memory_provider is not None and existing["memory_provider"] != memory_provider:
        raise ProfileError(
            f"profile {path}: recorded with memory provider "
            f"{existing['memory_provider']!r}, cannot append rows measured with "
            f"{memory_provider!r}; use another file"
        )
    return True


def read_profile(
    paths: str | Path | Iterable[str | Path],
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Raw features ``(n, 11)`` and latencies in ms ``(n,)`` (float64) of one or more
    profiles of the same memory provider, and the first file's metadata with ``files``
    (every path read) added."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not paths:
        raise ProfileError("no profile file given")
    raws, latencies, metas = [], [], []
    for path in paths:
        meta = _read_meta(path)
        if metas and meta["memory_provider"] != metas[0]["memory_provider"]:
            raise ProfileError(
                f"profiles {paths[0]} and {path} were recorded with different memory "
                f"providers ({metas[0]['memory_provider']!r}, {meta['memory_provider']!r}); "
                "their memory features measure different things and cannot be mixed"
            )
        table = _read_rows(path)
        raws.append(table[:, 1 : 1 + NUM_RAW])
        latencies.append(table[:, 1 + NUM_RAW])
        metas.append(meta)
    meta = {**metas[0], "files": [str(p) for p in paths]}
    return np.concatenate(raws), np.concatenate(latencies), meta


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ProfileError(f"profile {path}: no such file")
    sidecar = meta_path(path)
    if not sidecar.exists():
        raise ProfileError(
            f"profile {path}: its metadata file {sidecar} is missing (it records the memory "
            "provider the rows were measured with)"
        )
    try:
        meta = json.loads(read_text(sidecar, _prefixed(f"profile {path}: metadata file ")))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {path}: unreadable metadata file {sidecar} ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("memory_provider"), str):
        raise ProfileError(f"profile {path}: metadata file {sidecar} has no 'memory_provider'")
    return meta


def _prefixed(prefix: str) -> Callable[[str], ProfileError]:
    """The error ``user_files.read_text`` raises for a profile's file that cannot be read
    as text: its message (which names the file) after ``prefix``."""
    return lambda message: ProfileError(prefix + message)


def _csv_rows(path: Path) -> Iterator[list[str]]:
    """The profile's CSV rows, its header first. Read as text first: a binary or
    compressed file is a ProfileError naming it, not a UnicodeDecodeError mid-parse."""
    reader = csv.reader(io.StringIO(read_text(path, _prefixed("profile ")), newline=""))
    try:
        yield from reader
    except csv.Error as exc:  # not a ValueError: an overlong field, say
        raise ProfileError(f"profile {path}, line {reader.line_num}: not CSV ({exc})") from None


def _check_header(path: Path, header: list[str]) -> None:
    if tuple(header) == COLUMNS:
        return
    missing = [c for c in COLUMNS if c not in header]
    extra = [c for c in header if c not in COLUMNS]
    problems = []
    if missing:
        problems.append("missing column(s) " + ", ".join(missing))
    if extra:
        problems.append("unknown column(s) " + ", ".join(extra))
    if not problems:
        problems.append("columns out of order")
    raise ProfileError(
        f"profile {path}: {'; '.join(problems)}; expected the header {','.join(COLUMNS)}"
    )


def _read_rows(path: Path) -> np.ndarray:
    reader = _csv_rows(path)
    _check_header(path, next(reader, []))
    rows = []
    for line, row in enumerate(reader, start=2):
        if len(row) != len(COLUMNS):
            raise ProfileError(
                f"profile {path}, line {line}: {len(row)} fields, expected {len(COLUMNS)}"
            )
        try:
            rows.append([float(value) for value in row])
        except ValueError as exc:
            raise ProfileError(f"profile {path}, line {line}: {exc}") from None
    return np.array(rows, dtype=np.float64).reshape(-1, len(COLUMNS))
