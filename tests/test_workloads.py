"""Pair pool and workload cases: filtering, the case format, arrivals, class mixes, seeds."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("ijson")

from fairsched_plugin.experiment import case_files, workload_cli  # noqa: E402
from fairsched_plugin.experiment.case_files import (  # noqa: E402
    CaseFormatError,
    WorkloadRequest,
    read_case,
    write_case,
)
from fairsched_plugin.experiment.pairs import (  # noqa: E402
    PairPool,
    assign_tiers,
    build_pool,
    load_tokenizer,
    read_pool,
    request_class,
    write_pool,
)
from fairsched_plugin.experiment.workloads import (  # noqa: E402
    WORKLOADS,
    build_workload,
    clustered_arrivals,
    fixed_gap_arrivals,
    flash_crowd_arrivals,
    phased_poisson_arrivals,
    poisson_arrivals,
    split_counts,
)

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an "
    "each which she do how their if will up other about out many then them these so some "
    "her would make like him into time has look two more write go see number no way could "
    "people my than first water been call who oil its now find long down day did get come "
    "made may part code model server request token memory python function error data file"
).split()

SMALL_N = 40
"""Requests per case in the per-workload tests: enough to check shape, fast to build."""


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversation(i: int, prompt: str, response: str) -> dict:
    return {
        "id": f"c{i}",
        "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": response}],
    }


def synthetic_records() -> list[dict]:
    """150 short, 80 medium and 40 long prompts (about one token per word), each with
    a unique first word run so that no two prompts are equal, then 30 three-turn chats
    of short prompts."""
    rng = random.Random(0)
    lengths = (
        [rng.randint(5, 80) for _ in range(150)]
        + [rng.randint(200, 700) for _ in range(80)]
        + [rng.randint(1300, 1800) for _ in range(40)]
    )
    single = [
        conversation(i, f"case {i}: " + text(rng, n), text(rng, rng.randint(20, 110)))
        for i, n in enumerate(lengths)
    ]
    return single + [multi_turn_conversation(len(single) + i, rng) for i in range(30)]


def multi_turn_conversation(i: int, rng: random.Random, turns: int = 3) -> dict:
    """A chat of ``turns`` short user turns, each answered (for the multi_turn workload)."""
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": who, "value": f"chat {i} turn {k} {who}: " + text(rng, rng.randint(5, 40))}
            for k in range(turns) for who in ("human", "gpt")
        ],
    }


@pytest.fixture(scope="session")
def pool(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> PairPool:
    path = tmp_path_factory.mktemp("sharegpt") / "synthetic.json"
    path.write_text(json.dumps(synthetic_records()))
    return build_pool(tiny_model, path)


def write_sharegpt(path: Path, records: list) -> Path:
    path.write_text(json.dumps(records, indent=1))
    return path


# ------------------------------------------------------------------------------ pool


def test_synthetic_pool_has_every_class(pool: PairPool) -> None:
    assert pool.stats.kept == len(pool.pairs) == 270 + 30 * 3
    assert pool.class_counts() == {"short": 150 + 30 * 3, "medium": 80, "long": 40}


def test_filters_and_drop_reasons(tmp_path: Path, tiny_model: Path) -> None:
    rng = random.Random(1)
    ok = text(rng, 20)
    records = [
        conversation(0, "first " + ok, ok),  # kept
        conversation(1, "first " + ok, ok),  # same prompt text: duplicate
        conversation(2, "hi", ok),  # BOS + 1 token: prompt too short
        conversation(3, "second " + ok, "ok"),  # output too short
        conversation(4, text(rng, 80), ok),  # above the prompt cap of 50
        conversation(5, "third " + ok, text(rng, 80)),  # above the output cap of 50
        {  # system turn first, then two pairs; gpt -> human is not a pair
            "conversations": [
                {"from": "system", "value": "be nice"},
                {"from": "human", "value": "fourth " + ok},
                {"from": "gpt", "value": ok},
                {"from": "human", "value": "fifth " + ok},
                {"from": "gpt", "value": ok},
            ]
        },
        {"conversations": [{"from": "gpt", "value": ok}, {"from": "human", "value": ok}]},
    ]
    path = write_sharegpt(tmp_path / "f.json", records)

    built = build_pool(tiny_model, path, max_prompt_tokens=50, max_output_tokens=50)

    stats = built.stats
    assert [p.prompt.split()[0] for p in built.pairs] == ["first", "fourth", "fifth"]
    assert [(p.conversation, p.turn) for p in built.pairs] == [(0, 0), (6, 1), (6, 3)]
    assert stats.dropped == {
        "duplicate_prompt": 1,
        "prompt_too_short": 1,
        "prompt_too_long": 1,
        "output_too_short": 1,
        "output_too_long": 1,
    }
    assert stats.pairs_seen == stats.kept + sum(stats.dropped.values()) == 8
    assert (stats.conversations, stats.truncated, stats.stopped_early) == (8, False, False)
    assert all(4 <= p.prompt_tokens <= 50 and 4 <= p.output_tokens <= 50 for p in built.pairs)


def test_token_counts_are_the_engines(pool: PairPool, tiny_model: Path) -> None:
    """Prompts count the BOS the completions endpoint adds; a model dir and its
    tokenizer.json load the same tokenizer."""
    tokenizer = load_tokenizer(tiny_model / "tokenizer.json")
    pair = pool.pairs[0]
    assert pair.prompt_tokens == len(tokenizer.encode(pair.prompt).ids)
    without_bos = tokenizer.encode(pair.prompt, add_special_tokens=False)
    assert pair.prompt_tokens == len(without_bos.ids) + 1


def test_truncated_file_keeps_complete_conversations(tmp_path: Path, tiny_model: Path) -> None:
    records = synthetic_records()[:10]
    full = json.dumps(records, indent=1)
    path = tmp_path / "cut.json"
    path.write_text(full[: full.index('"c9"') + 2])  # inside the tenth record

    built = build_pool(tiny_model, path)

    assert (built.stats.conversations, built.stats.truncated) == (9, True)
    assert [p.conversation for p in built.pairs] == list(range(9))
    assert "truncated file" in built.stats.summary()


def test_max_pairs_stops_early(tmp_path: Path, tiny_model: Path) -> None:
    path = write_sharegpt(tmp_path / "s.json", synthetic_records())
    built = build_pool(tiny_model, path, max_pairs=7)
    assert len(built.pairs) == built.stats.kept == 7
    assert built.stats.stopped_early
    assert "stopped at max_pairs" in built.stats.summary()


def test_tiers_are_seeded(pool: PairPool) -> None:
    tiers = [p.tier for p in assign_tiers(pool.pairs, [0.2, 0.3, 0.5], seed=3)]
    assert tiers == [p.tier for p in assign_tiers(pool.pairs, [0.2, 0.3, 0.5], seed=3)]
    assert tiers != [p.tier for p in assign_tiers(pool.pairs, [0.2, 0.3, 0.5], seed=4)]
    assert set(tiers) == {0, 1, 2}
    assert {p.tier for p in assign_tiers(pool.pairs, [0, 1], seed=3)} == {1}
    with pytest.raises(ValueError, match="tier weights"):
        assign_tiers(pool.pairs, [0, 0], seed=3)


def test_pool_round_trips_through_jsonl(tmp_path: Path, pool: PairPool) -> None:
    write_pool(tmp_path / "pool.jsonl", pool)
    assert read_pool(tmp_path / "pool.jsonl") == pool
    (tmp_path / "case.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(ValueError, match="not a pair pool"):
        read_pool(tmp_path / "case.jsonl")


# ----------------------------------------------------------------------- case format


def request(**changes: object) -> WorkloadRequest:
    base = WorkloadRequest(id="r0", arrival_s=0.5, prompt="hello there", prompt_tokens=3,
                           output_tokens=8, tier=1, request_class="short", category="uniform")
    return replace(base, **changes)


def test_case_round_trip(tmp_path: Path) -> None:
    requests = [request(id=f"r{i}", arrival_s=i * 0.25) for i in range(3)]
    write_case(tmp_path / "case.jsonl", requests)
    assert read_case(tmp_path / "case.jsonl") == requests
    line = json.loads(requests[0].to_json())
    assert list(line) == list(case_files.CASE_KEYS)
    assert line["class"] == "short"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("tier"), r"missing key\(s\) 'tier'"),
        (lambda r: r.update(extra=1), r"unknown key\(s\) 'extra'"),
        (lambda r: r.update(prompt_tokens="3"), "key 'prompt_tokens' must be an integer >= 1"),
        (lambda r: r.update(output_tokens=0), "key 'output_tokens' must be an integer >= 1"),
        (lambda r: r.update(arrival_s=-1.0), "key 'arrival_s' must be a finite number >= 0"),
        (lambda r: r.update(tier=True), "key 'tier' must be an integer"),
        (lambda r: r.update(id=""), "key 'id' must be a non-empty string"),
        (lambda r: r.update({"class": "long"}), "key 'class' must be 'short' for 3 prompt"),
    ],
)
def test_read_case_names_line_and_key(tmp_path: Path, edit, message: str) -> None:
    record = json.loads(request().to_json())
    edit(record)
    path = tmp_path / "case.jsonl"
    path.write_text(request(id="ok").to_json() + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(CaseFormatError, match=rf"case\.jsonl:3: {message}"):
        read_case(path)


def test_read_case_rejects_bad_json_and_repeated_ids(tmp_path: Path) -> None:
    path = tmp_path / "case.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(CaseFormatError, match="case.jsonl:1: not valid JSON"):
        read_case(path)
    path.write_text(request().to_json() + "\n" + request().to_json() + "\n")
    with pytest.raises(CaseFormatError, match="case.jsonl:2: key 'id' 'r0' repeats line 1"):
        read_case(path)


# ----------------------------------------------------------------- arrival processes


def gaps(arrivals: np.ndarray) -> np.ndarray:
    return np.diff(np.sort(arrivals))


def cv(values: np.ndarray) -> float:
    return float(np.std(values) / np.mean(values))


def test_poisson_gaps_are_exponential() -> None:
    arrivals = poisson_arrivals(20_000, 4.0, np.random.default_rng(0))
    assert arrivals[0] == 0.0 and len(arrivals) == 20_000
    assert np.mean(gaps(arrivals)) == pytest.approx(0.25, rel=0.03)
    assert cv(gaps(arrivals)) == pytest.approx(1.0, abs=0.05)


def test_clusters_are_burstier_than_poisson() -> None:
    rng = np.random.default_rng(0)
    arrivals = clustered_arrivals(5_000, 1.0, (5, 20), 0.02, rng)
    assert len(arrivals) == 5_000
    assert cv(gaps(arrivals)) > 2.0


def test_fixed_gaps_are_exact() -> None:
    assert fixed_gap_arrivals(4, 0.1).tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_flash_crowd_spike_is_dense() -> None:
    arrivals = flash_crowd_arrivals(300, 5.0, [200], 2.0, np.random.default_rng(0))
    assert len(arrivals) == 500
    # Some 2-second window holds the spike plus its share of the background.
    in_window = np.searchsorted(arrivals, arrivals + 2.0) - np.arange(len(arrivals))
    assert in_window.max() >= 200


def test_phases_change_the_rate() -> None:
    arrivals = phased_poisson_arrivals([2000, 2000], [1.0, 10.0], np.random.default_rng(0))
    first, second = gaps(arrivals[:2000]), gaps(arrivals[2000:])
    assert np.mean(first) == pytest.approx(1.0, rel=0.1)
    assert np.mean(second) == pytest.approx(0.1, rel=0.1)


def test_split_counts_is_exact() -> None:
    assert split_counts(10, [0.8, 0.2]) == [8, 2]
    assert split_counts(7, [1, 1, 1]) == [3, 2, 2]
    assert sum(split_counts(101, [0.6, 0.3, 0.1])) == 101


# ------------------------------------------------------------------------- workloads


def small_case(name: str, pool: PairPool, seed: int = 0, **kwargs) -> list[WorkloadRequest]:
    return build_workload(name, pool, seed=seed, num_requests=SMALL_N, **kwargs)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_is_a_valid_seeded_case(name: str, pool: PairPool, tmp_path: Path) -> None:
    case = small_case(name, pool)

    assert len(case) == SMALL_N
    assert len({r.id for r in case}) == SMALL_N
    assert len({r.prompt for r in case}) == SMALL_N
    arrivals = [r.arrival_s for r in case]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert {r.category for r in case} == {name}
    assert all(r.request_class == request_class(r.prompt_tokens) for r in case)
    write_case(tmp_path / "case.jsonl", case)
    assert read_case(tmp_path / "case.jsonl") == case

    assert small_case(name, pool) == case
    other = small_case(name, pool, seed=1)
    assert [r.prompt for r in other] != [r.prompt for r in case]


def test_class_mixes_are_exact(pool: PairPool) -> None:
    def classes(case: list[WorkloadRequest]) -> dict[str, int]:
        return {c: sum(r.request_class == c for r in case) for c in ("short", "medium", "long")}

    assert classes(build_workload("short_long_mix", pool, seed=0, num_requests=50)) == {
        "short": 40, "medium": 0, "long": 10
    }
    assert classes(small_case("steady_short", pool))["short"] == SMALL_N
    assert classes(small_case("bursty_long", pool)) == {"short": 4, "medium": 12, "long": 24}


def test_apc_mix_is_49_to_1_with_exact_lengths(pool: PairPool, tiny_model: Path) -> None:
    case = build_workload("apc_mix", pool, seed=0, num_requests=100)
    tokenizer = load_tokenizer(tiny_model)

    short = [r for r in case if r.prompt_tokens <= 50]
    long = [r for r in case if r.prompt_tokens >= 200]
    assert (len(short), len(long)) == (98, 2)
    assert all(30 <= r.prompt_tokens <= 50 for r in short)
    assert all(200 <= r.prompt_tokens <= 220 for r in long)
    assert all(len(tokenizer.encode(r.prompt).ids) == r.prompt_tokens for r in case)
    assert all(32 <= r.output_tokens <= 128 for r in case)


def test_apc_mix_rate_rises_in_the_middle_phase(pool: PairPool) -> None:
    """Default phases: a quarter of the requests at 10 req/s, half at 40, a quarter at 10."""
    case = build_workload("apc_mix", pool, seed=0, num_requests=100)
    g = gaps(np.array([r.arrival_s for r in case]))
    outer, middle = np.r_[g[:24], g[75:]], g[25:74]
    assert np.mean(middle) < np.mean(outer) / 2


def test_sharegpt_fixed_gap(pool: PairPool) -> None:
    case = build_workload("sharegpt_fixed_gap", pool, seed=0, num_requests=100)
    assert [r.arrival_s for r in case] == pytest.approx([i * 0.1 for i in range(100)])
    slow = build_workload(
        "sharegpt_fixed_gap", pool, seed=0, num_requests=10, overrides={"gap_s": 1.0}
    )
    assert [r.arrival_s for r in slow] == pytest.approx(list(range(10)))


def test_rate_scale_stretches_arrivals_only(pool: PairPool) -> None:
    fast = small_case("bursty_conversational", pool)
    slow = small_case("bursty_conversational", pool, rate_scale=0.1)
    assert [r.arrival_s for r in slow] == pytest.approx([10 * r.arrival_s for r in fast])
    assert [r.prompt for r in slow] == [r.prompt for r in fast]


def test_caps_leave_long_pairs_out(pool: PairPool) -> None:
    case = small_case("uniform", pool, max_prompt_tokens=300, max_output_tokens=60)
    assert all(r.prompt_tokens <= 300 and r.output_tokens <= 60 for r in case)
    message = "workload bursty_long: needs 24 long pairs but the pool has 0"
    with pytest.raises(ValueError, match=message):
        small_case("bursty_long", pool, max_prompt_tokens=1024)


def test_bad_names_and_parameters_are_named(pool: PairPool) -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'; known: steady_short"):
        build_workload("nope", pool, seed=0)
    with pytest.raises(ValueError, match="uniform has no parameter.* gap_s; it has class_mix"):
        build_workload("uniform", pool, seed=0, overrides={"gap_s": 1.0})
    with pytest.raises(ValueError, match="rate_per_s must be positive"):
        build_workload("uniform", pool, seed=0, overrides={"rate_per_s": 0})
    with pytest.raises(ValueError, match="class_mix must weigh"):
        build_workload("uniform", pool, seed=0, overrides={"class_mix": {"huge": 1.0}})


# ------------------------------------------------------------------------------- CLI


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    workload_cli.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_builds_a_case_from_a_saved_pool(
    tmp_path: Path, pool: PairPool, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pool(tmp_path / "pool.jsonl", pool)
    out = tmp_path / "case.jsonl"
    argv = ["workload", "build", "--name", "flash_crowd", "--pool", str(tmp_path / "pool.jsonl"),
            "--out", str(out), "--num-requests", "30", "--rate-scale", "0.5",
            "--param", "spike_window_s=1.0"]
    assert run_cli(argv) == 0
    assert len(read_case(out)) == 30
    assert "30 requests over" in capsys.readouterr().out
    assert run_cli(argv[:-1] + ["nope=1"]) == 2
    assert "flash_crowd has no parameter(s) nope" in capsys.readouterr().err


def test_cli_builds_a_pool_and_lists(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sharegpt = write_sharegpt(tmp_path / "s.json", synthetic_records()[:20])
    argv = ["workload", "pool", "--model-dir", str(tiny_model), "--sharegpt", str(sharegpt),
            "--out", str(tmp_path / "pool.jsonl"), "--tier-weights", "0.5,0.5"]
    assert run_cli(argv) == 0
    assert "20 conversations read (whole file)" in capsys.readouterr().out
    assert {p.tier for p in read_pool(tmp_path / "pool.jsonl").pairs} == {0, 1}
    assert run_cli(["workload", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{name}: " in listing for name in WORKLOADS)


def test_export_for_vllm_bench_serve_keeps_prompt_and_output_length(tmp_path):
    requests = [
        WorkloadRequest(id="a", arrival_s=0.0, prompt="hello there", prompt_tokens=3,
                        output_tokens=7, tier=1, request_class="short", category="x"),
        WorkloadRequest(id="b", arrival_s=1.5, prompt="second", prompt_tokens=2,
                        output_tokens=9, tier=0, request_class="short", category="x"),
    ]
    case = tmp_path / "case.jsonl"
    write_case(case, requests)
    out = tmp_path / "vllm.jsonl"
    assert workload_cli.main_export_vllm(argparse.Namespace(case=case, out=out)) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [{"prompt": "hello there", "output_tokens": 7},
                    {"prompt": "second", "output_tokens": 9}]


def test_multi_turn_resends_each_turns_history(pool: PairPool) -> None:
    case = build_workload("multi_turn", pool, seed=3, num_requests=60, rate_scale=0.5)
    by_conversation: dict[str, list[WorkloadRequest]] = {}
    for request in case:
        by_conversation.setdefault(request.prompt.split(" turn ")[0], []).append(request)
    assert max(len(turns) for turns in by_conversation.values()) == 3
    for turns in by_conversation.values():
        for before, after in zip(turns, turns[1:]):
            assert after.prompt.startswith(before.prompt)  # the history, resent
            assert after.prompt_tokens > before.prompt_tokens
            assert after.arrival_s - before.arrival_s == pytest.approx(3.0 / 0.5)
    assert all(r.prompt.endswith("Assistant:") for r in case)
