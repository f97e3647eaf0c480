"""``fairsched bench``: compare policies on a real server and write the report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import ConfigError
from ..model.tiny import DEFAULT_MODEL_DIR, build_tiny_model
from .arms import parse_arms
from .pairs import PairPool, read_pool, write_pool
from .report import analyse_runs, render_markdown, write_report
from .runner import EngineSettings, run_external, run_matrix
from .workloads import (
    WORKLOADS,
    WorkloadRequest,
    add_pool_arguments,
    build_pool_from_args,
    build_workload,
    case_summary,
    parse_overrides,
    read_case,
    write_case,
)



def add_cli(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench", help="replay one workload against a server per policy and write a report"
    )
    bench.add_argument("--arms", "--policies", dest="arms", default="fcfs,aging",
                       help="comma-separated: stock, fcfs, aging, aging:alpha=150 ...")
    case = bench.add_mutually_exclusive_group(required=True)
    case.add_argument("--workload", choices=list(WORKLOADS), help="generate this workload")
    case.add_argument("--case", type=Path, help="replay this case file (JSONL)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--num-requests", type=int)
    bench.add_argument("--rate-scale", type=float, default=1.0,
                       help="multiply every arrival rate (0.1 suits the CPU engine)")
    bench.add_argument("--max-prompt-tokens", type=int)
    bench.add_argument("--max-output-tokens", type=int)
    bench.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="override a workload parameter (JSON value)")
    bench.add_argument("--repeat", type=int, default=1, help="interleaved repeats per arm")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"))
    bench.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                       help="model to serve (the tiny model is built here if missing)")
    bench.add_argument("--pool", type=Path,
                       help="ShareGPT pair pool (JSONL); built from --model-dir and saved "
                            "here if missing")
    bench.add_argument("--max-num-batched-tokens", type=int, default=256)
    bench.add_argument("--max-num-seqs", type=int, default=256)
    bench.add_argument("--max-model-len", type=int, default=4096)
    bench.add_argument("--dtype", default="float32")
    bench.add_argument("--engine-arg", action="append", default=[],
                       help="extra vLLM argument, repeatable (e.g. --engine-arg=--enforce-eager)")
    bench.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    bench.add_argument("--base-url", help="replay against this running server instead")
    bench.add_argument("--served-model", help="model name at --base-url (default: --model-dir)")
    bench.add_argument("--label", default="external", help="arm name for --base-url runs")
    add_pool_arguments(bench)
    bench.set_defaults(func=main)


def load_pool(args: argparse.Namespace) -> PairPool:
    """The saved pool at ``--pool`` if there is one, else a new one (saved there if given)."""
    if args.pool and args.pool.exists():
        return read_pool(args.pool)
    pool = build_pool_from_args(args)
    if args.pool:
        args.pool.parent.mkdir(parents=True, exist_ok=True)
        write_pool(args.pool, pool)
    return pool


def load_cases(args: argparse.Namespace) -> list[WorkloadRequest]:
    if args.case:
        return read_case(args.case)
    return build_workload(
        args.workload,
        load_pool(args),
        seed=args.seed,
        num_requests=args.num_requests,
        rate_scale=args.rate_scale,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        overrides=parse_overrides(args.param),
    )


def main(args: argparse.Namespace) -> int:
    try:
        arms = parse_arms(args.arms)
        if args.base_url is None and args.model_dir == DEFAULT_MODEL_DIR:
            build_tiny_model(args.model_dir)
        cases = load_cases(args)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_case(args.out / "case.jsonl", cases)
    print(case_summary(cases), flush=True)
    engine = EngineSettings(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        extra=tuple(args.engine_arg),
    )
    if args.base_url:
        runs = run_external(
            args.base_url, args.served_model or str(args.model_dir), cases, args.out,
            label=args.label, repeat=args.repeat, timeout_s=args.timeout,
        )
    else:
        runs = run_matrix(
            arms, str(args.model_dir), cases, args.out,
            repeat=args.repeat, engine=engine, timeout_s=args.timeout,
        )
    config = {
        "command": " ".join(["fairsched", *sys.argv[1:]]),
        "arms": [arm.name for arm in arms] if not args.base_url else [args.label],
        "workload": args.workload or str(args.case),
        "case": case_summary(cases),
        "engine_args": engine.args(),
        "repeat": args.repeat,
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    report = write_report(args.out, runs, config=config)
    print(render_markdown(analyse_runs(runs), main_only=True))
    print(f"report: {report}")
    return 0
