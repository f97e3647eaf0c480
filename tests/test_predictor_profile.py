"""The profile file: schema, sidecar, resuming, and the errors ``read_profile`` gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fairsched_plugin.predictor.features import RAW_FEATURES
from fairsched_plugin.predictor.profiling import (
    COLUMNS,
    ProfileError,
    ProfileWriter,
    meta_path,
    read_profile,
)

ROW = np.array([96, 2, 4, 400, 300, 128, 128, 1000.5, 3000.25, 800, 900], dtype=np.float32)


def _write(path: Path, provider: str = "kv_cache", rows: int = 2) -> Path:
    writer = ProfileWriter(path, provider, {"engine": "test"})
    for step in range(rows):
        writer.write(step + 1, ROW + step, 0.0125 + step / 1000)
    writer.close()
    return path


def test_header_rows_and_sidecar(tmp_path):
    path = _write(tmp_path / "deep" / "dir" / "profile.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "step," + ",".join(RAW_FEATURES) + ",latency_ms"
    assert lines[0].split(",") == list(COLUMNS)
    assert lines[1] == "1,96,2,4,400,300,128,128,1000.5,3000.25,800,900,12.500000"
    meta = json.loads(meta_path(path).read_text())
    assert meta_path(path).name == "profile.csv.meta.json"
    assert meta["memory_provider"] == "kv_cache" and meta["engine"] == "test"
    assert meta["feature_names"] == list(RAW_FEATURES)
    assert meta["hardware"].startswith("CPU ") and meta["vllm_version"] and meta["created"]


def test_read_profile_round_trip(tmp_path):
    raw, latency, meta = read_profile(_write(tmp_path / "p.csv", rows=3))
    assert raw.shape == (3, 11) and latency.shape == (3,)
    np.testing.assert_allclose(raw[2], ROW + 2)
    np.testing.assert_allclose(latency, [12.5, 13.5, 14.5])
    assert meta["files"] == [str(tmp_path / "p.csv")]


def test_writer_resumes_a_profile_of_the_same_provider(tmp_path):
    path = _write(tmp_path / "p.csv", rows=2)
    _write(path, rows=3)
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and lines.count(lines[0]) == 1
    with pytest.raises(ProfileError, match="recorded with memory provider 'kv_cache'.*'nvml'"):
        ProfileWriter(path, "nvml", {})


def test_several_files_are_concatenated(tmp_path):
    raw, latency, meta = read_profile([_write(tmp_path / "a.csv", rows=2),
                                       _write(tmp_path / "b.csv", rows=3)])
    assert raw.shape == (5, 11) and len(meta["files"]) == 2


def test_mixing_memory_providers_is_refused(tmp_path):
    a = _write(tmp_path / "a.csv", "kv_cache")
    b = _write(tmp_path / "b.csv", "torch")
    with pytest.raises(ProfileError, match=r"a\.csv and .*b\.csv .*different memory providers"):
        read_profile([a, b])


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (COLUMNS[:-1], "missing column.* latency_ms"),
        ((*COLUMNS, "kv_usage"), "unknown column.* kv_usage"),
        ((COLUMNS[1], COLUMNS[0], *COLUMNS[2:]), "columns out of order"),
    ],
)
def test_header_errors_name_the_column_and_the_file(tmp_path, header, message):
    path = _write(tmp_path / "p.csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([",".join(header), *lines[1:]]) + "\n")
    with pytest.raises(ProfileError, match=f"profile {re.escape(str(path))}: {message}"):
        read_profile(path)


def test_bad_rows_and_missing_sidecar_are_named(tmp_path):
    path = _write(tmp_path / "p.csv")
    with open(path, "a") as file:
        file.write("3,1,2,3\n")
    with pytest.raises(ProfileError, match="p.csv, line 4: 4 fields, expected 13"):
        read_profile(path)
    meta_path(path).unlink()
    with pytest.raises(ProfileError, match="metadata file .*p.csv.meta.json is missing"):
        read_profile(path)
