"""benchmarks/step_cost_terms.py on a planted run: steps timed by a known model with a context term."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from step_cost_terms import decode_context_k  # noqa: E402


def test_decode_context_counts_prompt_and_output_so_far() -> None:
    requests = [
        # decoding from 1 s to 3 s: at 2 s half of its 100 outputs are out
        {"prompt_tokens": 1000, "output_tokens": 100, "prefill_done_s": 0.9,
         "first_token_s": 1.0, "finish_s": 3.0},
        # still prefilling at 2 s
        {"prompt_tokens": 500, "output_tokens": 10, "prefill_done_s": 2.5,
         "first_token_s": 2.6, "finish_s": 4.0},
        # finished before 2 s
        {"prompt_tokens": 300, "output_tokens": 10, "prefill_done_s": 0.1,
         "first_token_s": 0.2, "finish_s": 1.5},
    ]
    assert decode_context_k(requests, 2.0) == (1000 + 50) / 1e3
    assert decode_context_k(requests, 0.95) == (1000 + 300 + 10 * 0.75 / 1.3) / 1e3


def _run(run_dir: Path, start: float, rng: random.Random) -> None:
    run_dir.mkdir(parents=True)
    requests = []
    for i in range(30):
        done = 0.2 * i + 0.05
        requests.append({"id": f"q{i}", "prompt_tokens": rng.randint(50, 2000),
                         "output_tokens": rng.randint(5, 200), "prefill_done_s": done,
                         "first_token_s": done + 0.01, "finish_s": done + rng.uniform(0.5, 3.0)})
    (run_dir / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    steps = []
    for k in range(300):
        t = 0.03 * k + 0.0013  # never on a request's boundary
        prefill, decode = rng.randint(0, 256), rng.randint(0, 60)
        ms = 2.0 + 0.05 * prefill + 0.2 * decode + 0.5 * decode_context_k(requests, t)
        steps.append({"t": start + t, "prefill_tokens": prefill, "decode_tokens": decode,
                      "num_prefills": 1, "num_running": 8, "num_waiting": k % 2,
                      "step_time_s": ms / 1e3})
    (run_dir / "trace.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_a_planted_context_term_is_found_and_explains_every_step(tmp_path: Path) -> None:
    rng = random.Random(3)
    arms = {}
    for arm, start in (("fcfs", 1000.0), ("default", 2000.0)):
        run_dir = tmp_path / "runs" / arm / "r1" / "case"
        _run(run_dir, start, rng)
        arms[arm] = {"repeats": [{"category": "case",
                                  "meta": {"dir": str(run_dir), "start_wall": start}}]}
    (tmp_path / "report.json").write_text(json.dumps({"arms": arms}))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_cost_terms.py"),
         str(tmp_path / "report.json"), "--case", "case"],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in out.splitlines()[2:]}
    context = rows["context"]
    assert [float(c) for c in context[1:5]] == [2.0, 0.05, 0.2, 0.5]
    assert float(context[5]) == 0.0 and all(float(r) == 0.0 for r in context[6:])
    assert float(rows["tokens only"][5]) > 0.1  # without the term the fit misses
