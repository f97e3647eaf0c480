"""``fairsched bench``: compare policies on a real server and write the report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli_types import positive_float, positive_int
from ..config import ConfigError
from ..model.tiny import DEFAULT_MODEL_DIR, build_tiny_model
from ..config import ENV_PREFIX, SERVICE_MODES
from ..user_files import output_dir
from .arms import ARMS_HELP, parse_arms
from .case_files import WorkloadRequest, case_summary, read_case, write_case
from .pairs import PairPool, load_tokenizer, read_pool, write_pool
from .report import analyse_runs, render_markdown, write_report
from .runner import EngineSettings, run_external, run_matrix
from .server import add_engine_limit_arguments
from .traces import add_trace_arguments, check_trace_arguments, trace_cases_from_args
from .workload_cli import add_pool_arguments, build_pool_from_args, build_workload_from_args
from .workloads import WORKLOADS



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
    case.add_argument("--workload", type=_workload_names, metavar="NAME[,NAME...]",
                      help="generate these workloads (one server start per arm replays all; "
                           f"{SEED002_SUITE!r} = the eight seed-002 categories): "
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


def load_pool(args: argparse.Namespace) -> PairPool:
    """The saved pool at ``--pool`` if there is one, else a new one (saved there if given)."""
    if args.pool and args.pool.exists():
        return read_pool(args.pool)
    pool = build_pool_from_args(args)
    if args.pool:
        args.pool.parent.mkdir(parents=True, exist_ok=True)
        write_pool(args.pool, pool)
    return pool


SEED002_SUITE = "seed002"
SEED002_CATEGORIES = (
    "steady_short", "steady_mixed", "bursty_conversational", "bursty_long",
    "flash_crowd", "low_load", "short_long_mix", "uniform",
)
"""The eight seed-002 workload categories, in the order of the seed's tables."""


def _workload_names(text: str) -> list[str]:
    names: list[str] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        names.extend(SEED002_CATEGORIES if name == SEED002_SUITE else [name])
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown workload(s) {unknown or text!r}; choose from {', '.join(WORKLOADS)} "
            f"or {SEED002_SUITE!r}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"workloads must be distinct, got {names}")
    return names


def add_sampling_arguments(parser: argparse.ArgumentParser, seed_help: str,
                           rate_help: str = "") -> None:
    """How a case is drawn from its workload: the options ``bench``, ``simulate`` and
    ``tune`` share, so the same flags build the same cases everywhere."""
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--num-requests", type=positive_int,
                        help="requests per case (default: each workload's own; with --trace "
                             "the window's size)")
    parser.add_argument("--rate-scale", type=_scales, default=[1.0], metavar="X[,X...]",
                        help=" ".join(filter(None, ["multiply every arrival rate", rate_help]))
                             + "; several values replay each workload at each load level")
    parser.add_argument("--max-prompt-tokens", type=positive_int,
                        help="draw no pair with a longer prompt (default: no limit)")
    parser.add_argument("--max-output-tokens", type=positive_int,
                        help="draw no pair with a longer response (default: no limit)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="override a workload parameter (JSON value; repeatable)")


def _scales(text: str) -> list[float]:
    try:
        scales = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rate-scale {text!r}: numbers, comma-separated")
    if not scales or any(not scale > 0 for scale in scales) or len(set(scales)) != len(scales):
        raise argparse.ArgumentTypeError(f"--rate-scale {text!r}: distinct numbers > 0")
    return scales


def load_cases(args: argparse.Namespace) -> dict[str, list[WorkloadRequest]]:
    """The cases to replay, by name: one case file, or each generated workload at each
    rate scale (:func:`build_cases`), or the trace's window at each rate with prompts of
    the recorded lengths in the served model's tokenizer."""
    check_trace_arguments(args)
    if args.case:
        return {args.case.stem: read_case(args.case)}
    if args.trace:
        return trace_cases_from_args(args, load_tokenizer(args.model_dir))
    return build_cases(load_pool(args), args)


def workload_label(args: argparse.Namespace) -> str:
    """What a report names as the workload: the generated ones, the case file or the trace."""
    if args.workload:
        return ",".join(args.workload)
    return str(args.case) if args.case else f"trace {args.trace}"


def write_cases(out: Path, cases: dict[str, list[WorkloadRequest]]) -> None:
    """Save a run's cases in ``out`` (``case.jsonl``, or ``case-NAME.jsonl`` each when
    there are several) and print a summary line of each."""
    out.mkdir(parents=True, exist_ok=True)
    for name, case in cases.items():
        write_case(out / (f"case-{name}.jsonl" if len(cases) > 1 else "case.jsonl"), case)
        print(f"{name}: {case_summary(case)}", flush=True)


def build_cases(pool: PairPool, args: argparse.Namespace) -> dict[str, list[WorkloadRequest]]:
    """Each of ``args.workload`` at each of ``args.rate_scale``, named ``NAME@xSCALE`` when
    there are several scales."""
    cases = {}
    for name in args.workload:
        for scale in args.rate_scale:
            label = name if len(args.rate_scale) == 1 else f"{name}@x{scale:g}"
            cases[label] = build_workload_from_args(name, pool, args, rate_scale=scale)
    return cases


PATH_KEYS = ("predictor.path", "profile.path", "trace_path")


def plugin_settings(args: argparse.Namespace) -> dict[str, str]:
    """``FAIRSCHED_*`` settings shared by every plugin arm."""
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is not KEY=VALUE")
        key = key.strip()
        if key in PATH_KEYS and value:
            value = str(Path(value).resolve())  # the server runs in its own directory
        settings[ENV_PREFIX + key.replace(".", "_").upper()] = value
    if args.service:
        settings["FAIRSCHED_SERVICE"] = args.service
    if args.max_batch_size is not None:
        settings["FAIRSCHED_MAX_BATCH_SIZE"] = str(args.max_batch_size)
    return settings


def main(args: argparse.Namespace) -> int:
    try:
        arms = parse_arms(args.arms, plugin_settings(args))
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
        "plugin_settings": plugin_settings(args),
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
