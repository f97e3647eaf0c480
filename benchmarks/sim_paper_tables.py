"""The papers' experiments at their own scale, simulated with the analytic model, with
the papers' figures beside. Each run is a ``fairsched simulate`` command (printed), its
report kept under ``--out``.

- the chunked-prefill paper's Table 4: Aging vs FCFS, ShareGPT 200 requests at a fixed 0.1 s gap,
  chunk (token budget) 256, 512 and 1,024, context 512, generation up to 512, Qwen3-8B on an
  RTX 4090.
- the ordering-policies paper: the eight categories, ranked service (max batch 16, prefill budget
  4,096), eight policies, Qwen3-0.6B on an A100 (the paper's tables are per model, averaged over
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


def table4(out: Path, step_model: str, alpha: str, max_num_seqs: int | None) -> str:
    rows = ["| chunk | policy | sim mean E2E (s) | paper | sim P95 E2E (s) | paper | "
            "sim mean TTFT (s) | paper | sim P95 TTFT (s) | paper |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    aging = f"aging:alpha={alpha}"
    for chunk, paper in TABLE4_PAPER.items():
        seqs = max_num_seqs or min(chunk, 256)
        target = out / f"table4-chunk{chunk}-seqs{seqs}"
        run(["simulate", "--arms", f"fcfs,{aging}", "--workload", "sharegpt_fixed_gap",
             "--num-requests", "200", "--param", "gap_s=0.1", "--max-prompt-tokens", "512",
             "--max-output-tokens", "512", "--max-model-len", "1024",
             "--max-num-batched-tokens", str(chunk), "--max-num-seqs", str(seqs),
             "--pool", POOL, "--step-model", step_model, "--out", str(target)])
        for policy, arm in (("fcfs", "fcfs"), ("aging", aging)):
            agg = stats(target / "report.json", arm)
            lat = agg["latency"]
            sim = (lat["e2e_s"]["mean"]["mean"], lat["e2e_s"]["p95"]["mean"],
                   lat["ttft_s"]["mean"]["mean"], lat["ttft_s"]["p95"]["mean"])
            cells = " | ".join(f"{s:.2f} | {p:.2f}" for s, p in zip(sim, paper[policy]))
            rows.append(f"| {chunk} | {arm} | {cells} |")
    return "\n".join(rows)


# gap -> quantile -> (prefill LPRS, prefill budget, request LPRS, request budget), ms
TABLE9_PAPER = {
    0.1: {"p50": (397.88, 406.09, 545.99, 555.51), "p80": (647.75, 662.35, 797.26, 830.74),
          "p90": (772.10, 814.88, 908.34, 942.81), "p99": (889.45, 924.22, 952.56, 986.93)},
    1.0: {"p50": (0.0934, 0.0890, 138.52, 129.29), "p80": (0.1208, 0.1174, 150.60, 147.47),
          "p90": (0.1446, 0.1353, 152.49, 147.83), "p99": (22.890, 22.010, 153.35, 148.99)},
}
TABLE10_PAPER = {"Mean request E2E (ms)": (143.65, 111.68),
                 "Mean prefill E2E (ms)": (136.04, 104.69),
                 "P90 request E2E (ms)": (254.89, 192.15),
                 "P90 prefill E2E (ms)": (247.58, 185.66),
                 "Avg scheduled prefill seqs": (5.32, 0.46),
                 "Avg prefill chunk": (0.78, 6.29)}


def surrogate(out: Path, step_model: str) -> Path:
    """An ONNX predictor for LPRS fitted to the step model (``sim.surrogate``)."""
    from fairsched_plugin.sim import surrogate as sur
    import numpy as np

    path = out / "surrogate.onnx"
    model = sur.parse_step_model(step_model)
    weights, _, stats = sur.fit(model, sur.sample_batches(4000, 4096, 256, 4096,
                                                           np.random.default_rng(0)))
    sur.write(path, weights, model.description, stats)
    print(f"surrogate predictor: MAPE {stats['mape_pct']:.1f}% against the step model")
    return path


def table9(out: Path, step_model: str, target_ms: str) -> str:
    predictor = surrogate(out, step_model)
    rows = ["| gap | quantile | sim prefill LPRS | paper | sim prefill budget | paper | "
            "sim request LPRS | paper | sim request budget | paper |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for gap, paper in TABLE9_PAPER.items():
        common = ["--workload", "sharegpt_fixed_gap", "--num-requests", "1000",
                  "--param", f"gap_s={gap}", "--max-model-len", "4096", "--pool", POOL,
                  "--step-model", step_model]
        budget_dir, lprs_dir = out / f"table9-gap{gap}-budget", out / f"table9-gap{gap}-lprs"
        run(["simulate", "--arms", "fcfs", "--max-num-batched-tokens", "1024",
             *common, "--out", str(budget_dir)])
        run(["simulate", "--arms", "fcfs+lprs", "--max-num-batched-tokens", "4096",
             "--set", f"predictor.path={predictor}", "--set", f"lprs.target_ms={target_ms}",
             *common, "--out", str(lprs_dir)])
        lprs = stats(lprs_dir / "report.json", "fcfs+lprs")["latency"]
        budget = stats(budget_dir / "report.json", "fcfs")["latency"]
        for q, figures in paper.items():
            sim = (lprs["prefill_e2e_s"][q]["mean"], budget["prefill_e2e_s"][q]["mean"],
                   lprs["e2e_s"][q]["mean"], budget["e2e_s"][q]["mean"])
            cells = " | ".join(f"{s * 1e3:.1f} | {p:g}" for s, p in zip(sim, figures))
            rows.append(f"| {gap} s | {q.upper()} | {cells} |")
    return "\n".join(rows)


def table10(out: Path, step_model: str, target_ms: str, rate_scale: float = 1.0) -> str:
    predictor = surrogate(out, step_model)
    target = out / f"table10-x{rate_scale:g}"
    run(["simulate", "--arms", "fcfs+lprs,fcfs+lprs+apc", "--workload", "apc_mix",
         "--rate-scale", str(rate_scale),
         "--max-num-batched-tokens", "4096", "--max-model-len", "4096",
         "--set", f"predictor.path={predictor}", "--set", f"lprs.target_ms={target_ms}",
         "--pool", POOL, "--step-model", step_model, "--out", str(target)])
    off, on = (stats(target / "report.json", arm) for arm in ("fcfs+lprs", "fcfs+lprs+apc"))

    def figures(agg: dict) -> list[float]:
        lat, batch = agg["latency"], agg["batch"]
        return [lat["e2e_s"]["mean"]["mean"] * 1e3, lat["prefill_e2e_s"]["mean"]["mean"] * 1e3,
                lat["e2e_s"]["p90"]["mean"] * 1e3, lat["prefill_e2e_s"]["p90"]["mean"] * 1e3,
                batch["avg_prefill_seqs_per_step"]["mean"],
                batch["avg_prefill_chunk_tokens"]["mean"]]

    rows = ["| metric | sim APC off | sim APC on | sim change | paper off | paper on |",
            "|---|---|---|---|---|---|"]
    for (name, paper), a, b in zip(TABLE10_PAPER.items(), figures(off), figures(on)):
        rows.append(f"| {name} | {a:.2f} | {b:.2f} | {(b - a) / a:+.1%} | {paper[0]:g} | "
                    f"{paper[1]:g} |")
    apc = on.get("apc", {})
    rows.append(f"| APC outcomes (on) | | {json.dumps({k: v['mean'] for k, v in apc.items()})} "
                "| | | 4,960 cap, 1,541 min chunk |")
    return "\n".join(rows)


SEED002_ARMS = "fcfs,spf,aging-spf,lpf,srtf,estf,af-lcb,tier"


SEED002_PAPER = {  # L40S, Qwen3-0.6B, averaged over categories: (tok/s, P95 latency s)
    "fcfs": (217.2, 34.34), "tier": (213.7, 34.48), "spf": (230.3, 31.67),
    "aging-spf": (244.9, 29.29), "estf": (None, 30.36), "srtf": (None, 34.29),
    "lpf": (None, 34.97), "af-lcb": (None, 32.21),
}
"""The ordering-policies paper's Tables 2 and 3, the Qwen3-0.6B rows (the extracted text lost four
throughput cells)."""


def seed002(out: Path, step_model: str, num_requests: int | None, reuse: bool = False) -> str:
    target = out / "seed002"
    argv = ["simulate", "--arms", SEED002_ARMS, "--workload", "seed002",
            "--set", "service=ranked", "--set", "max_batch_size=16",
            "--max-num-batched-tokens", "4096", "--max-num-seqs", "256",
            "--max-output-tokens", "1024", "--pool", POOL, "--step-model", step_model,
            "--out", str(target)]
    if num_requests:
        argv += ["--num-requests", str(num_requests)]
    if not (reuse and (target / "report.json").exists()):
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
    rows += ["", "Averaged over the categories, against FIFO (the paper: L40S, Qwen3-0.6B):", "",
             "| policy | sim tok/s | sim P95 E2E (s) | sim P95 / FIFO | paper tok/s | "
             "paper P95 (s) | paper P95 / FIFO |", "|---|---|---|---|---|---|---|"]
    means = {}
    for arm in arms:
        nodes = [report["arms"][arm]["by_category"][c] for c in categories]
        means[arm] = (sum(n["throughput"]["output_tokens_per_s"]["mean"] for n in nodes)
                      / len(nodes),
                      sum(n["latency"]["e2e_s"]["p95"]["mean"] for n in nodes) / len(nodes))
    for arm in arms:
        tok, p95 = means[arm]
        paper_tok, paper_p95 = SEED002_PAPER.get(arm, (None, None))
        rows.append(f"| {arm} | {tok:.0f} | {p95:.2f} | {p95 / means['fcfs'][1]:.3f} | "
                    f"{paper_tok if paper_tok is not None else '-'} | {paper_p95} | "
                    f"{paper_p95 / SEED002_PAPER['fcfs'][1]:.3f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("which", choices=("table4", "table9", "table10", "seed002"))
    parser.add_argument("--target-ms", default="105",
                        help="LPRS target (the chunked-prefill paper: 105 ms)")
    parser.add_argument("--out", type=Path, default=Path("runs/sim-paper"))
    parser.add_argument("--step-model")
    parser.add_argument("--alpha", default="37.5",
                        help="Aging's alpha (the chunked-prefill paper's code: 37.5)")
    parser.add_argument("--num-requests", type=int)
    parser.add_argument("--reuse", action="store_true",
                        help="seed002: format an existing report instead of running")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="table10: multiply apc_mix's arrival rates")
    parser.add_argument("--max-num-seqs", type=int,
                        help="table4: running-request limit (default: the budget, at most "
                             "256; the paper does not state its own)")
    args = parser.parse_args()
    if args.which == "table4":
        text = table4(args.out, args.step_model or "analytic:rtx4090:qwen3-8b", args.alpha,
                      args.max_num_seqs)
    elif args.which in ("table9", "table10"):
        args.out.mkdir(parents=True, exist_ok=True)
        step_model = args.step_model or "analytic:rtxpro5000:qwen3-8b"
        if args.which == "table9":
            text = table9(args.out, step_model, args.target_ms)
        else:
            text = table10(args.out, step_model, args.target_ms, args.rate_scale)
    else:
        text = seed002(args.out, args.step_model or "analytic:a100:qwen3-0.6b",
                       args.num_requests, args.reuse)
    suffix = f"-seqs{args.max_num_seqs}" if args.max_num_seqs else ""
    if args.rate_scale != 1.0:
        suffix += f"-x{args.rate_scale:g}"
    (args.out / f"{args.which}{suffix}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
