"""Every ``fairsched`` tool answers bad input with one line naming the file or the option,
never a traceback: a binary, compressed or directory input; an output under a folder that
does not exist (made) or where a file or folder is in the way (refused before the work);
a size, rate or count no run can have (refused by argparse before anything heavy loads).

Each case runs ``fairsched_plugin.cli.main`` in-process and stops before any simulation,
server or training, except the few that show an output written into new folders.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from fairsched_plugin.experiment.pairs import POOL_FORMAT, POOL_KIND
from fairsched_plugin.cli import main
from fairsched_plugin.predictor.profiling import meta_path
from fairsched_plugin.user_files import UserFileError, read_text

BINARY = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))
"""The start of an executable: NUL bytes and bytes that are not UTF-8."""
PROFILE_META = {"memory_provider": "kv_cache"}
LPRS = ["lprs-predictor", "--device", "h100", "--max-num-batched-tokens", "2048",
        "--max-num-seqs", "64", "--max-model-len", "4096"]
SIMULATE = ["simulate", "--arms", "stock", "--step-model", "linear:5:0.01", "--no-trace"]
TRACE = ["--trace", "azure-conv", "--num-requests", "3"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Bad inputs, and a good case file. A profile's reader opens its metadata file
    first, so the binary and gzip files have one, to reach the CSV itself."""
    root = tmp_path_factory.mktemp("bad-input")
    found = {
        "binary": root / "binary.csv",
        "gzip": root / "trace.csv.gz",
        "folder": root / "folder",
        "plain": root / "plain.txt",
        "model": root / "model",
        "case": root / "case.jsonl",
        "pool": root / "pool.jsonl",
    }
    found["binary"].write_bytes(BINARY)
    found["gzip"].write_bytes(gzip.compress(b"arrival_s,prompt_tokens,output_tokens\n0,9,9\n"))
    for profile in (found["binary"], found["gzip"]):
        meta_path(profile).write_text(json.dumps(PROFILE_META))
    found["folder"].mkdir()
    found["plain"].write_text("a file where a folder must go\n")
    found["model"].mkdir()
    (found["model"] / "config.json").write_bytes(BINARY)
    assert main(["workload", "build", *TRACE, "--out", str(found["case"])]) == 0
    header = {"kind": POOL_KIND, "format": POOL_FORMAT, "tokenizer": "t", "stats": {}}
    found["pool"].write_text(json.dumps(header) + "\n{\"prompt\": \n")
    return found


def _argv(template: list[str], files: dict[str, Path], out: Path) -> list[str]:
    return [part.format(**{k: str(v) for k, v in files.items()}, out=out) for part in template]


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Exit status (argparse's SystemExit included) and stderr; no traceback anywhere."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def _error_line(err: str, prefix: str = "error: ") -> str:
    """The one line on stderr, which starts with ``prefix`` and is short."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix) and len(lines[0]) < 300, lines[0]
    return lines[0]


UNREADABLE = [
    ("simulate-trace-binary", [*SIMULATE, "--trace", "{binary}", "--out", "{out}"],
     "{binary}: not a text file (a NUL byte on line 1)"),
    ("simulate-trace-gzip", [*SIMULATE, "--trace", "{gzip}", "--out", "{out}"],
     "{gzip}: not a text file (gzip-compressed"),
    ("simulate-trace-folder", [*SIMULATE, "--trace", "{folder}", "--out", "{out}"],
     "{folder}: is a directory"),
    ("simulate-case-binary", [*SIMULATE, "--case", "{binary}", "--out", "{out}"],
     "{binary}: not a text file"),
    ("simulate-case-gzip", [*SIMULATE, "--case", "{gzip}", "--out", "{out}"],
     "{gzip}: not a text file"),
    ("simulate-case-folder", [*SIMULATE, "--case", "{folder}", "--out", "{out}"],
     "{folder}: is a directory"),
    ("simulate-pool-binary",
     [*SIMULATE, "--workload", "uniform", "--pool", "{binary}", "--out", "{out}"],
     "{binary}: not a text file"),
    ("simulate-pool-folder",
     [*SIMULATE, "--workload", "uniform", "--pool", "{folder}", "--out", "{out}"],
     "{folder}: is a directory"),
    ("simulate-pool-bad-line",
     [*SIMULATE, "--workload", "uniform", "--pool", "{pool}", "--out", "{out}"],
     "{pool}:2: not valid JSON"),
    ("simulate-tokenizer-binary",
     [*SIMULATE, "--workload", "uniform", "--model-dir", "{binary}", "--out", "{out}"],
     "{binary}: not a tokenizer.json"),
    ("simulate-model-config-binary",
     ["simulate", "--arms", "stock", "--step-model", "analytic:h100:{model}", *TRACE,
      "--out", "{out}"],
     "{model}/config.json: not a text file"),
    ("workload-build-trace-binary",
     ["workload", "build", "--trace", "{binary}", "--out", "{out}/case.jsonl"],
     "{binary}: not a text file"),
    ("workload-export-case-gzip",
     ["workload", "export-vllm", "--case", "{gzip}", "--out", "{out}/vllm.jsonl"],
     "{gzip}: not a text file"),
    ("lprs-predictor-model-binary", [*LPRS, "--model", "{model}", "--out", "{out}/m.onnx"],
     "{model}/config.json: not a text file"),
    ("eval-predictor-profile-gzip",
     ["eval-predictor", "--model", "{binary}", "--profile", "{gzip}", "--out", "{out}"],
     "profile {gzip}: not a text file (gzip-compressed"),
]


@pytest.mark.parametrize("argv, message", [case[1:] for case in UNREADABLE],
                         ids=[case[0] for case in UNREADABLE])
def test_an_unreadable_input_is_one_line_naming_the_file(argv, message, files, tmp_path,
                                                         capsys):
    out = tmp_path / "out"
    code, err = _run(_argv(argv, files, out), capsys)
    assert code == 2
    assert message.format(**files) in _error_line(err)


def test_train_names_a_binary_profile(files, tmp_path, capsys):
    pytest.importorskip("torch")
    code, err = _run(["train", "--profile", str(files["binary"]),
                      "--out", str(tmp_path / "m.onnx")], capsys)
    assert code == 2
    assert f"profile {files['binary']}: not a text file" in _error_line(err)


@pytest.mark.parametrize("name, reason", [("binary", "not a text file"),
                                          ("folder", "is a directory")])
def test_check_config_names_a_file_it_cannot_read(name, reason, files, capsys):
    """check-config keeps its own prefix (and exit 2 for its own input)."""
    code, err = _run(["check-config", "--file", str(files[name])], capsys)
    assert code == 2
    line = _error_line(err, prefix="fairsched check-config: --file ")
    assert f"{files[name]}: {reason}" in line


NEW_OUTPUTS = [
    ("workload-build", ["workload", "build", *TRACE, "--out", "{out}"], "new/dir/case.jsonl"),
    ("workload-export-vllm", ["workload", "export-vllm", "--case", "{case}", "--out", "{out}"],
     "new/dir/vllm.jsonl"),
    ("simulate", [*SIMULATE, *TRACE, "--out", "{out}"], "new/dir/run"),
]


@pytest.mark.parametrize("argv, output", [case[1:] for case in NEW_OUTPUTS],
                         ids=[case[0] for case in NEW_OUTPUTS])
def test_an_output_under_new_folders_is_written(argv, output, files, tmp_path, capsys):
    out = tmp_path / output
    code, _ = _run(_argv(argv, files, out), capsys)
    assert code == 0
    assert out.exists()


def test_lprs_predictor_writes_into_new_folders(tmp_path, capsys):
    pytest.importorskip("onnx")
    out = tmp_path / "new" / "dir" / "lprs.onnx"
    code, _ = _run([*LPRS, "--model", "qwen3-8b", "--samples", "160", "--out", str(out)],
                   capsys)
    assert code == 0 and out.stat().st_size > 0


REFUSED_OUTPUTS = [
    ("workload-build-folder", ["workload", "build", *TRACE, "--out", "{folder}"],
     "{folder}: is a directory"),
    ("lprs-predictor-folder", [*LPRS, "--model", "qwen3-8b", "--out", "{folder}"],
     "{folder}: is a directory"),
    ("simulate-under-a-file", [*SIMULATE, *TRACE, "--out", "{plain}/run"],
     "{plain}/run: cannot create the folder"),
    ("tune-file", ["tune", "--step-model", "linear:5:0.01", *TRACE, "--out", "{plain}"],
     "{plain}: is a file"),
    ("bench-file", ["bench", "--case", "{case}", "--base-url", "http://127.0.0.1:9",
                    "--out", "{plain}"], "{plain}: is a file"),
    ("profile-folder", ["profile", "--samples", "5", "--out", "{folder}"],
     "{folder}: is a directory"),
    ("profile-under-a-file", ["profile", "--samples", "5", "--out", "{plain}/p.csv"],
     "{plain}/p.csv: cannot create the folder {plain}"),
    ("model-tiny-file", ["model", "tiny", "--out", "{plain}"], "{plain}: is a file"),
]


@pytest.mark.parametrize("argv, message", [case[1:] for case in REFUSED_OUTPUTS],
                         ids=[case[0] for case in REFUSED_OUTPUTS])
def test_an_output_path_in_the_way_is_refused_before_the_work(argv, message, files, tmp_path,
                                                              capsys):
    code, err = _run(_argv(argv, files, tmp_path / "out"), capsys)
    assert code == 2
    assert message.format(**files) in _error_line(err)


def test_train_refuses_its_output_before_training(files, tmp_path, capsys):
    pytest.importorskip("torch")
    from predictor_data import write_synthetic_profile

    profile = write_synthetic_profile(tmp_path / "profile.csv", 200)
    code, err = _run(["train", "--profile", str(profile), "--out", str(files["folder"])],
                     capsys)
    assert code == 2
    assert f"{files['folder']}: is a directory" in _error_line(err)


SIZES = [
    ("simulate", "--repeat", "0", [*SIMULATE, *TRACE, "--out", "{out}"], "must be >= 1, not 0"),
    ("simulate", "--num-requests", "-3", [*SIMULATE, "--trace", "azure-conv", "--out", "{out}"],
     "must be >= 1, not -3"),
    ("simulate", "--target-ms", "nan", [*SIMULATE, *TRACE, "--out", "{out}"],
     "must be a finite number > 0, not nan"),
    ("simulate", "--kv-cache-tokens", "0", [*SIMULATE, *TRACE, "--out", "{out}"],
     "must be >= 1, not 0"),
    ("simulate", "--max-virtual-s", "-1", [*SIMULATE, *TRACE, "--out", "{out}"],
     "must be a finite number > 0, not -1"),
    ("simulate", "--trace-start", "-1", [*SIMULATE, *TRACE, "--out", "{out}"],
     "must be >= 0, not -1"),
    ("tune", "--repeat", "0", ["tune", "--step-model", "linear:5:0.01", *TRACE], "must be >= 1"),
    ("tune", "--max-p99-ratio", "0", ["tune", "--step-model", "linear:5:0.01", *TRACE],
     "must be a finite number > 0"),
    ("bench", "--repeat", "0", ["bench", "--case", "{case}"], "must be >= 1, not 0"),
    ("bench", "--max-num-seqs", "0", ["bench", "--case", "{case}"], "must be >= 1, not 0"),
    ("bench", "--max-num-batched-tokens", "-5", ["bench", "--case", "{case}"],
     "must be >= 1, not -5"),
    ("bench", "--timeout", "0", ["bench", "--case", "{case}"], "must be a finite number > 0"),
    ("profile", "--samples", "0", ["profile", "--out", "{out}/p.csv"], "must be >= 1, not 0"),
    ("profile", "--rate-scale", "nan", ["profile", "--samples", "5", "--out", "{out}/p.csv"],
     "must be a finite number > 0, not nan"),
    ("workload build", "--num-requests", "0",
     ["workload", "build", "--trace", "azure-conv", "--out", "{out}"], "must be >= 1, not 0"),
    ("workload build", "--rate-scale", "-1", ["workload", "build", *TRACE, "--out", "{out}"],
     "must be a finite number > 0, not -1"),
    ("lprs-predictor", "--max-num-seqs", "0",
     ["lprs-predictor", "--device", "h100", "--model", "qwen3-8b",
      "--max-num-batched-tokens", "2048", "--max-model-len", "4096", "--out", "{out}"],
     "must be >= 1, not 0"),
    ("lprs-predictor", "--samples", "1", [*LPRS, "--model", "qwen3-8b", "--out", "{out}"],
     "must be >= 160, not 1"),
    ("model tiny", "--vocab-size", "0", ["model", "tiny", "--out", "{out}"],
     "must be >= 1, not 0"),
    ("train", "--threads", "0", ["train", "--profile", "{binary}", "--out", "{out}"],
     "must be >= 1, not 0"),
]


@pytest.mark.parametrize("verb, option, value, argv, message", SIZES,
                         ids=[f"{case[0]} {case[1]} {case[2]}" for case in SIZES])
def test_a_nonsensical_size_is_refused_by_argparse(verb, option, value, argv, message, files,
                                                   tmp_path, capsys):
    code, err = _run([*_argv(argv, files, tmp_path / "out"), option, value], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"fairsched {verb}: error: argument {option}: {message}"), last


@pytest.mark.parametrize("option", ["--max-num-seqs", "--max-num-batched-tokens",
                                    "--max-model-len", "--block-size"])
def test_an_engine_limit_below_one_is_refused_by_the_simulator(option, tmp_path, capsys):
    """The simulated engine's limits take the same argparse type as every other size."""
    code, err = _run([*SIMULATE, *TRACE, option, "0", "--out", str(tmp_path)], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"fairsched simulate: error: argument {option}: must be >= 1"), last


def test_the_surrogate_fit_is_measured_on_held_out_batches():
    """A fit of 16 weights is refused below 10 samples per weight, and its error is
    measured on the fifth it did not see, so a model that the features cannot express
    shows its real error."""
    from fairsched_plugin.predictor.features import NUM_FEATURES, MemoryState, batch_row
    from fairsched_plugin.sim import surrogate
    from fairsched_plugin.sim.step_models import parse_step_model

    assert surrogate.MIN_SAMPLES == 10 * NUM_FEATURES
    model = parse_step_model("analytic:h100:qwen3-8b")
    batches = surrogate.sample_batches(200, 2048, 64, 4096, np.random.default_rng(0))
    with pytest.raises(ValueError, match="samples must be >= 160"):
        surrogate.fit(model, batches[:1])
    weights, error, stats = surrogate.fit(model, batches)
    assert stats["samples"] == 200 and stats["held_out"] == 40
    # The same weights on the held-out batches, worked out here.
    memory = MemoryState(0.0, 0.0, 0.0, 0.0)
    held_out = batches[-40:]
    x = np.stack([batch_row(b.stats(), memory) for b in held_out])
    y = np.array([model.step_time_s(b, memory) * 1e3 for b in held_out])
    assert error == pytest.approx(float(np.mean(np.abs(x @ weights - y) / y)))
    assert error > 0


def test_read_text_names_the_line_and_drops_a_byte_order_mark(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b\n1,2\n\xff\n")
    with pytest.raises(UserFileError, match=rf"^{bad}: not a text file \(not UTF-8 on line 3"):
        read_text(bad)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfa,b\n")
    assert read_text(bom) == "a,b\n"
    with pytest.raises(UserFileError, match=rf"^{tmp_path / 'absent'}: no such file$"):
        read_text(tmp_path / "absent")
