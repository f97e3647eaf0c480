"""``fairsched bench``: compare policies on a real server and write the report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli_types import positive_float, positive_int
from ..config import SERVICE_MODES, ConfigError
from ..experiment.arms import ARMS_HELP, parse_arms
from ..experiment.case_files import case_summary
from ..experiment.cases import (
    SEED002_SUITE,
    add_sampling_arguments,
    load_cases,
    plugin_settings,
    workload_label,
    workload_names,
    write_cases,
)
from ..experiment.report import analyse_runs, render_markdown, write_report
from ..experiment.traces import add_trace_arguments
from ..experiment.workload_cli import add_pool_arguments
from ..experiment.workloads import WORKLOADS
from ..model.tiny import DEFAULT_MODEL_DIR, build_tiny_model
from ..user_files import output_dir
from .runner import EngineSettings, run_external, run_matrix
from .server import add_engine_limit_arguments



def add_cli(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench", help="replay workloads against a server per policy and write a report",
        description="For each arm (a policy and its settings, or stock vLLM), starts a "
                    "vLLM OpenAI server, replays every case at its recorded arrival times "
                    "as streamed completions, and stops it; arms are interleaved over "
                    "--repeat rounds. Writes the cases, config.json and a report (TTFT, "
                    "TPOT, end-to-end latency and throughput per arm, with plots) to --out. "
                    "With --base-url it replays against a server already running instead.")
    bench.add_argument("--arms", "--policies", dest="arms", default="fcfs,aging",
                       help=ARMS_HELP)
    case = bench.add_mutually_exclusive_group(required=True)
    case.add_argument("--workload", type=workload_names, metavar="NAME[,NAME...]",
                      help="generate these workloads (one server start per arm replays all; "
                           f"{SEED002_SUITE!r} = the ordering-policies paper's eight categories): "
                           + ", ".join(WORKLOADS))
    case.add_argument("--case", type=Path, help="replay this case file (JSONL)")
    add_trace_arguments(bench, case)
    add_sampling_arguments(bench, seed_help="workload seed: arrivals and the pairs drawn",
                           rate_help="(0.1 suits the CPU engine)")
    bench.add_argument("--repeat", type=positive_int, default=1,
                       help="interleaved repeats per arm")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"),
                       help="directory for the cases, server logs, runs and report")
    bench.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                       help="model to serve (the tiny model is built here if missing)")
    bench.add_argument("--pool", type=Path,
                       help="ShareGPT pair pool (JSONL); built from --model-dir and saved "
                            "here if missing")
    add_engine_limit_arguments(bench)
    bench.add_argument("--dtype", default="float32",
                       help="vLLM's model dtype (--dtype); float32 suits the CPU engine")
    bench.add_argument("--service", choices=SERVICE_MODES,
                       help="plugin service mode for every plugin arm (FAIRSCHED_SERVICE; "
                            "default: the plugin's, budget)")
    bench.add_argument("--max-batch-size", type=positive_int,
                       help="requests served per step with --service ranked (default: the "
                            "plugin's, 16)")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="plugin config for every plugin arm, dotted key "
                            "(e.g. --set lprs.target_ms=30 --set predictor.path=m.onnx)")
    bench.add_argument("--target-ms", type=positive_float,
                       help="score every arm's step times against this latency target "
                            "(default: lprs.target_ms when set)")
    bench.add_argument("--engine-arg", action="append", default=[],
                       help="extra vLLM argument, repeatable (e.g. --engine-arg=--enforce-eager)")
    bench.add_argument("--timeout", type=positive_float, default=600.0,
                       help="per-request timeout (s)")
    bench.add_argument("--vllm-bench", action="store_true",
                       help="after each replay, replay the same case with vLLM's own client "
                            "(vllm bench serve, Poisson at the case's mean rate) on the same "
                            "server, and report both")
    bench.add_argument("--base-url",
                       help="replay against this running server instead (default: start "
                            "one per arm)")
    bench.add_argument("--served-model", help="model name at --base-url (default: --model-dir)")
    bench.add_argument("--label", default="external", help="arm name for --base-url runs")
    add_pool_arguments(bench)
    bench.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        arms = parse_arms(args.arms, plugin_settings(args.set, args.service, args.max_batch_size))
        if args.base_url is None and args.model_dir == DEFAULT_MODEL_DIR:
            build_tiny_model(args.model_dir)
        output_dir(args.out)  # before a pool is tokenized, which takes minutes
        cases = load_cases(args)
        write_cases(args.out, cases)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = EngineSettings.from_args(args)
    if args.base_url:
        runs = run_external(
            args.base_url, args.served_model or str(args.model_dir), cases, args.out,
            label=args.label, repeat=args.repeat, timeout_s=args.timeout,
        )
    else:
        runs = run_matrix(
            arms, str(args.model_dir), cases, args.out,
            repeat=args.repeat, engine=engine, timeout_s=args.timeout,
            vllm_bench=args.vllm_bench,
        )
    config = {
        "command": " ".join(["fairsched", *sys.argv[1:]]),
        "arms": [arm.name for arm in arms] if not args.base_url else [args.label],
        "workload": workload_label(args),
        "case": {name: case_summary(case) for name, case in cases.items()},
        "plugin_settings": plugin_settings(args.set, args.service, args.max_batch_size),
        "engine_args": engine.args(),
        "repeat": args.repeat,
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    target = args.target_ms
    if target is None and "FAIRSCHED_LPRS_TARGET_MS" in config["plugin_settings"]:
        target = float(config["plugin_settings"]["FAIRSCHED_LPRS_TARGET_MS"])
    report = write_report(args.out, runs, config=config, target_ms=target)
    print(render_markdown(analyse_runs(runs), main_only=True))
    print(f"report: {report}")
    return 0
