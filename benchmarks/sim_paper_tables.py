"""The papers' experiments at their own scale, simulated with the analytic model, with
the papers' figures beside. Each run is a ``fairsched simulate`` command (printed), its
report kept under ``--out``.

- seed 000 Table 4: Aging vs FCFS, ShareGPT 200 requests at a fixed 0.1 s gap, chunk
  (token budget) 256, 512 and 1,024, context 512, generation up to 512, Qwen3-8B on an
  RTX 4090.
- seed 002: the eight categories, ranked service (max batch 16, prefill budget 4,096),
  eight policies, Qwen3-0.6B on an A100 (the seed's tables are per model, averaged over
  categories on an L40S, which has no preset here; its figures are quoted for the trend).

    PYTHONPATH=. python benchmarks/sim_paper_tables.py table4 --out runs/sim-paper
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from fairsched_plugin.cli import main as fairsched

POOL = ".cache/sharegpt-pool.jsonl"
TABLE4_PAPER = {  # chunk -> policy -> (mean E2E, P95 E2E, mean TTFT, P95 TTFT), seconds
    256: {"fcfs": (118.72, 195.73, 107.82, 184.86), "aging": (106.56, 183.58, 95.67, 172.73)},
    512: {"fcfs": (115.52, 196.63, 104.12, 185.24), "aging": (107.73, 185.72, 96.72, 174.78)},
    1024: {"fcfs": (109.38, 190.10, 98.14, 178.34), "aging": (110.59, 189.64, 99.39, 178.39)},
}


def run(argv: list[str]) -> None:
    print("fairsched " + shlex.join(argv), flush=True)
    code = fairsched(argv)
    if code != 0:
        raise SystemExit(f"simulate failed ({code})")


def stats(report: Path, arm: str) -> dict:
    return json.loads(report.read_text())["arms"][arm]["aggregate"]


def table4(out: Path, step_model: str, alpha: str) -> str:
    rows = ["| chunk | policy | sim mean E2E (s) | paper | sim P95 E2E (s) | paper | "
            "sim mean TTFT (s) | paper | sim P95 TTFT (s) | paper |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    aging = f"aging:alpha={alpha}"
    for chunk, paper in TABLE4_PAPER.items():
        target = out / f"table4-chunk{chunk}"
        run(["simulate", "--arms", f"fcfs,{aging}", "--workload", "sharegpt_fixed_gap",
             "--num-requests", "200", "--param", "gap_s=0.1", "--max-prompt-tokens", "512",
             "--max-output-tokens", "512", "--max-model-len", "1024",
             "--max-num-batched-tokens", str(chunk), "--max-num-seqs", str(min(chunk, 256)),
             "--pool", POOL, "--step-model", step_model, "--out", str(target)])
        for policy, arm in (("fcfs", "fcfs"), ("aging", aging)):
            agg = stats(target / "report.json", arm)
            lat = agg["latency"]
            sim = (lat["e2e_s"]["mean"]["mean"], lat["e2e_s"]["p95"]["mean"],
                   lat["ttft_s"]["mean"]["mean"], lat["ttft_s"]["p95"]["mean"])
            cells = " | ".join(f"{s:.2f} | {p:.2f}" for s, p in zip(sim, paper[policy]))
            rows.append(f"| {chunk} | {arm} | {cells} |")
    return "\n".join(rows)


SEED002_ARMS = "fcfs,spf,aging-spf,lpf,srtf,estf,af-lcb,tier"


def seed002(out: Path, step_model: str, num_requests: int | None) -> str:
    target = out / "seed002"
    argv = ["simulate", "--arms", SEED002_ARMS, "--workload", "seed002",
            "--set", "service=ranked", "--set", "max_batch_size=16",
            "--max-num-batched-tokens", "4096", "--max-num-seqs", "256",
            "--max-output-tokens", "1024", "--pool", POOL, "--step-model", step_model,
            "--out", str(target)]
    if num_requests:
        argv += ["--num-requests", str(num_requests)]
    run(argv)
    report = json.loads((target / "report.json").read_text())
    arms = list(report["arms"])
    rows = ["| category | " + " | ".join(f"{a} tok/s, P95 E2E (s)" for a in arms) + " |",
            "|---" * (len(arms) + 1) + "|"]
    categories = list(report["arms"][arms[0]]["by_category"])
    for category in categories:
        cells = []
        for arm in arms:
            node = report["arms"][arm]["by_category"][category]
            cells.append(f"{node['throughput']['output_tokens_per_s']['mean']:.0f}, "
                         f"{node['latency']['e2e_s']['p95']['mean']:.2f}")
        rows.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("which", choices=("table4", "seed002"))
    parser.add_argument("--out", type=Path, default=Path("runs/sim-paper"))
    parser.add_argument("--step-model")
    parser.add_argument("--alpha", default="37.5", help="Aging's alpha (seed 000's code: 37.5)")
    parser.add_argument("--num-requests", type=int)
    args = parser.parse_args()
    if args.which == "table4":
        text = table4(args.out, args.step_model or "analytic:rtx4090:qwen3-8b", args.alpha)
    else:
        text = seed002(args.out, args.step_model or "analytic:a100:qwen3-0.6b",
                       args.num_requests)
    (args.out / f"{args.which}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
