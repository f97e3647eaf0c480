"""Production traces as cases: the packaged Azure trace, windows, compression to a rate
with the bursts kept, the two column layouts, errors that name the row, exact prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fairsched_plugin.experiment import traces
from fairsched_plugin.experiment.traces import TraceFormatError


def test_the_packaged_trace_is_the_azure_conversation_trace_with_its_attribution() -> None:
    rows = traces.read_trace("azure-conv")
    assert len(rows) == 19_366
    assert np.median([r.prompt_tokens for r in rows]) == 1020
    readme = (traces.resolve("azure-conv").parent / "README.md").read_text()
    assert "CC-BY" in readme and "Splitwise" in readme and "ISCA 2024" in readme


def test_a_window_at_a_rate_keeps_the_relative_gaps() -> None:
    rows = traces.window(traces.read_trace("azure-conv"), 500, start=100)
    case = traces.trace_case(rows, "azure-conv", rate=14.0)
    assert [r.id for r in case[:2]] == ["azure-conv-100", "azure-conv-101"]
    assert case[0].arrival_s == 0.0
    assert (len(case) - 1) / case[-1].arrival_s == pytest.approx(14.0)
    recorded = np.diff([r.arrival_s for r in rows])
    compressed = np.diff([r.arrival_s for r in case])
    assert np.allclose(compressed, recorded * compressed.sum() / recorded.sum())
    assert [r.prompt_tokens for r in case] == [r.prompt_tokens for r in rows]
    assert [r.output_tokens for r in case] == [r.output_tokens for r in rows]


def test_an_access_log_layout_reads_and_keeps_recorded_times(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,user\n100.5,20,3,a\n101,2000,9,b\n")
    case = traces.load_trace_case(path)
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.request_class) for r in case] == [
        ("mine-0", 0.0, 20, "short"), ("mine-1", 0.5, 2000, "long")]


@pytest.mark.parametrize("body, where", [
    ("time,tokens\n1,2\n", "lacks the columns"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,3\n", ":3: column 'prompt_tokens'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n-1,10,3\n", ":3: column 'arrival_s'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,0\n", ":3: column 'output_tokens'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10.5,2\n", ":3: column 'prompt_tokens'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n2,10,2\n1,10,2\n", ":4: column "
                                                                       "'arrival_s' 1 is before"),
    ("arrival_s,prompt_tokens,output_tokens\n", "no requests"),
])
def test_a_bad_trace_names_the_row_and_column(tmp_path: Path, body: str, where: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceFormatError, match=where.replace("(", r"\(")):
        traces.read_trace(path)


def test_windows_and_rates_out_of_range_are_refused() -> None:
    rows = traces.read_trace("azure-conv")
    with pytest.raises(ValueError, match="trace-start"):
        traces.window(rows, 10, start=len(rows))
    with pytest.raises(ValueError, match="only 6 rows"):
        traces.window(rows, 10, start=len(rows) - 6)
    with pytest.raises(ValueError, match="trace-rate"):
        traces.trace_case(rows[:10], "x", rate=0)
    with pytest.raises(TraceFormatError, match="no such file"):
        traces.read_trace("nowhere.csv")


def test_prompts_have_exactly_the_recorded_token_counts(tiny_model: Path) -> None:
    from fairsched_plugin.experiment.pairs import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    case = traces.load_trace_case("azure-conv", num_requests=40, rate=10)
    written = traces.with_exact_prompts(case, tokenizer)
    assert [len(tokenizer.encode(r.prompt).ids) for r in written] == [
        r.prompt_tokens for r in case]
    assert len({r.prompt[:20] for r in written}) == len(written)  # no shared prefixes


def test_workload_build_writes_a_trace_case(tmp_path: Path, tiny_model: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from fairsched_plugin.cli import main

    out = tmp_path / "case.jsonl"
    assert main(["workload", "build", "--trace", "azure-conv", "--num-requests", "12",
                 "--trace-start", "5", "--trace-rate", "3", "--model-dir", str(tiny_model),
                 "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records][:1] == ["azure-conv-5"] and len(records) == 12
    assert all(r["prompt"] for r in records)
    assert main(["workload", "build", "--name", "uniform", "--trace-rate", "3",
                 "--model-dir", str(tiny_model), "--out", str(out)]) == 2
    assert "need --trace" in capsys.readouterr().err


def test_bench_replays_a_trace_with_exact_prompts(tiny_model: Path) -> None:
    from fairsched_plugin.experiment.cases import load_cases
    from fairsched_plugin.experiment.pairs import load_tokenizer
    from fairsched_plugin.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "--arms", "stock", "--trace", "azure-conv", "--num-requests", "6",
         "--trace-rate", "2,4", "--model-dir", str(tiny_model)])
    cases = load_cases(args)
    assert list(cases) == ["azure-conv@2rps", "azure-conv@4rps"]
    tokenizer = load_tokenizer(tiny_model)
    for case in cases.values():
        assert [len(tokenizer.encode(r.prompt).ids) for r in case] == [
            r.prompt_tokens for r in case]
    assert cases["azure-conv@2rps"][-1].arrival_s == pytest.approx(2.5)


def test_the_mooncake_trace_is_packaged_with_its_blocks_and_attribution() -> None:
    rows = traces.read_trace("mooncake-conv")
    assert len(rows) == 12_031
    assert all(len(r.blocks) == -(-r.prompt_tokens // 512) and r.block_tokens == 512
               for r in rows)
    assert rows[-1].arrival_s == pytest.approx(3536.999)  # recorded in ms
    readme = (traces.resolve("mooncake-conv").parent / "README.md").read_text()
    assert "Apache-2.0" in readme and "FAST 2025" in readme
    assert (traces.resolve("mooncake-conv").parent / "LICENSE-mooncake-apache-2.0").is_file()


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_an_own_jsonl_log_names_blocks_or_sessions(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "log.jsonl", [
        {"arrival_s": 1.0, "prompt_tokens": 600, "output_tokens": 50, "block_hashes": ["s", 7]},
        {"arrival_s": 1.5, "prompt_tokens": 300, "output_tokens": 40, "session": "u1",
         "turn": 1},
        {"arrival_s": 9.0, "prompt_tokens": 700, "output_tokens": 10, "session": "u1",
         "turn": 2},
    ])
    case = traces.load_trace_case(path)
    assert case[0].blocks == ("s", "7") and case[0].block_tokens == 512
    # A turn names its prompt's and its answer's blocks; the next turn repeats them.
    assert case[1].blocks == ("u1/0",) and case[2].blocks == ("u1/0", "u1/1")
    assert [r.arrival_s for r in case] == [0.0, 0.5, 8.0]
    line = case[2].to_json()
    assert type(case[2]).from_json(line) == case[2]


@pytest.mark.parametrize("records, where", [
    ([{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2],
       "user": 3}], ":1: unknown field(s) 'user'"),
    ([{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}],
     ":1: field 'hash_ids' has 1 hashes for a prompt of 600 tokens"),
    ([{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1]},
      {"timestamp": 4, "input_length": 10, "output_length": 5, "hash_ids": [2]}],
     ":2: field 'timestamp' 4 is before"),
    ([{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}],
     ":1: field 'output_length' must be an integer >= 1"),
    ([{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, "session": "a", "turn": 2}],
     ":1: session 'a' turn 2 follows turn 0"),
    ([{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, "session": "a", "turn": 1},
      {"arrival_s": 1, "prompt_tokens": 12, "output_tokens": 5, "session": "a", "turn": 2}],
     ":2: session 'a' turn 2 has a prompt of 12 tokens, shorter than"),
    ([{"arrival_s": 0, "prompt_tokens": 10}], ":1: missing field(s) 'output_tokens'"),
    ([{"when": 0}], ":1: fields when are not a trace's"),
])
def test_a_bad_jsonl_trace_names_the_line_and_field(tmp_path: Path, records: list[dict],
                                                    where: str) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(TraceFormatError, match=str(path) + where.replace("(", r"\(").replace(
            ")", r"\)")):
        traces.read_trace(path)
