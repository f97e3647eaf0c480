"""``fairsched workload``: list the named workloads, build a pair pool, build a case (a
named workload or a window of a production trace) and export a case for ``vllm bench
serve``.

The verbs and their argument helpers live here rather than beside the generators: a case
comes from ``experiment.workloads`` or ``experiment.traces`` and is written with
``experiment.case_files``, so the command line is the one module that needs all three.
``bench``, ``simulate`` and ``profile`` reuse its pool options (:func:`add_pool_arguments`,
:func:`build_pool_from_args`); ``bench`` also its sizing options
(:func:`build_workload_from_args`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cli_types import positive_float, positive_int
from ..user_files import output_file
from .case_files import WorkloadRequest, case_summary, read_case, write_case, write_vllm_custom
from .pairs import (
    DEFAULT_MAX_TOKENS,
    PairPool,
    build_pool,
    load_tokenizer,
    read_pool,
    write_pool,
)
from .traces import add_trace_arguments, check_trace_arguments, trace_cases_from_args
from .workloads import WORKLOADS, build_workload, describe


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``workload list|pool|build`` on a top-level argparse subparsers object."""
    workload = subparsers.add_parser(
        "workload", help="list, build and export benchmark workload cases",
        description="A case is one benchmark run's traffic: one request per line (JSONL) "
                    "with its arrival offset, prompt and target output length. Named "
                    "workloads are seeded generators over a ShareGPT pair pool; production "
                    "traces are replayed as recorded.")
    commands = workload.add_subparsers(dest="workload_command", required=True)

    listing = commands.add_parser(
        "list", help="print every workload and its parameters",
        description="Prints every named workload with its default parameters (the keys "
                    "--param overrides).")
    listing.set_defaults(func=main_list)

    pool = commands.add_parser(
        "pool", help="build the ShareGPT pair pool and save it (JSONL)",
        description="Tokenizes ShareGPT's human-to-assistant pairs with the served "
                    "model's tokenizer (pairs under four tokens on either side or over "
                    "--pair-cap dropped, duplicates removed) and saves them, so that "
                    "'workload build', bench and simulate reuse them with --pool instead "
                    "of tokenizing again.")
    pool.add_argument("--model-dir", type=Path, required=True, help="model dir or tokenizer.json")
    pool.add_argument("--out", type=Path, required=True, help="the pool file to write (JSONL)")
    add_pool_arguments(pool)
    pool.set_defaults(func=main_pool)

    build = commands.add_parser(
        "build", help="write one workload case (JSONL)",
        description="Writes one case: a named workload drawn from a pair pool, or a "
                    "window of a production trace.")
    what = build.add_mutually_exclusive_group(required=True)
    what.add_argument("--name", choices=list(WORKLOADS), help="a generated workload")
    add_trace_arguments(build, what)
    source = build.add_mutually_exclusive_group()
    source.add_argument("--model-dir", type=Path,
                        help="model dir or tokenizer.json (with --trace: write prompts of the "
                             "recorded lengths in this tokenizer; without, prompts stay empty, "
                             "which only the simulator replays)")
    source.add_argument("--pool", type=Path, help="a pool saved by 'workload pool'")
    build.add_argument("--out", type=Path, required=True, help="the case file to write (JSONL)")
    build.add_argument("--seed", type=int, default=0,
                       help="seed of the arrivals and of the pairs drawn")
    build.add_argument("--num-requests", type=positive_int,
                       help="requests in the case (default: the workload's own, see "
                            "'workload list'; with --trace the window's size)")
    build.add_argument("--rate-scale", type=positive_float, default=1.0,
                       help="multiply every arrival rate (about 0.1 for the tiny CPU engine)")
    build.add_argument("--max-prompt-tokens", type=positive_int,
                       help="draw no pair with a longer prompt")
    build.add_argument("--max-output-tokens", type=positive_int,
                       help="draw no pair with a longer response")
    build.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="override a workload parameter; VALUE is JSON (repeatable)")
    add_pool_arguments(build)
    build.set_defaults(func=main_build)
    export = commands.add_parser(
        "export-vllm",
        help="write a case as vllm bench serve's custom dataset (prompt, output_tokens)",
        description="Converts a case into the custom dataset 'vllm bench serve' reads: "
                    "each request's prompt and output length; arrival times and tiers "
                    "do not carry over (vLLM's client reads neither).")
    export.add_argument("--case", type=Path, required=True, help="the case file (JSONL)")
    export.add_argument("--out", type=Path, required=True, help="a .jsonl file")
    export.set_defaults(func=main_export_vllm)


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pool building (not with --pool)")
    group.add_argument("--sharegpt", type=Path,
                       help="ShareGPT JSON (default: the packaged file)")
    group.add_argument("--max-pairs", type=positive_int,
                       help="stop reading once this many pairs are kept (default: read all)")
    group.add_argument("--pair-cap", type=positive_int, default=DEFAULT_MAX_TOKENS,
                       help="drop pairs with more prompt or response tokens")
    group.add_argument("--tier-weights", type=_floats, metavar="W0,W1,...",
                       help="assign seeded service tiers 0,1,... with these weights "
                            "(default: every request in tier 0)")


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param {item!r}: expected KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--param {key}: {value!r} is not JSON") from None
    return overrides


def build_pool_from_args(args: argparse.Namespace) -> PairPool:
    """Build a pool as the pool-building options say, and print how it was built."""
    pool = build_pool(
        args.model_dir,
        args.sharegpt,
        max_prompt_tokens=args.pair_cap,
        max_output_tokens=args.pair_cap,
        max_pairs=args.max_pairs,
        tier_weights=args.tier_weights,
    )
    print(pool.stats.summary())
    return pool


def pool_from_args(args: argparse.Namespace) -> PairPool:
    """Read the saved pool or build one, and print its class mix."""
    pool = read_pool(args.pool) if getattr(args, "pool", None) else build_pool_from_args(args)
    print(f"pool classes: {pool.class_counts()}")
    return pool


def main_export_vllm(args: argparse.Namespace) -> int:
    """CLI entry: convert a case for ``vllm bench serve``."""
    try:
        requests = read_case(args.case)
        written = write_vllm_custom(output_file(args.out), requests)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {written} requests to {args.out}")
    return 0


def main_list(args: argparse.Namespace) -> int:
    """CLI entry: print every workload with its default parameters."""
    print("\n".join(describe(workload) for workload in WORKLOADS.values()))
    return 0


def main_pool(args: argparse.Namespace) -> int:
    """CLI entry: build the pair pool and save it for reuse."""
    try:
        output_file(args.out)  # before tokenizing, which takes minutes
        write_pool(args.out, pool_from_args(args))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


def build_workload_from_args(
    name: str, pool: PairPool, args: argparse.Namespace, rate_scale: float | None = None
) -> list[WorkloadRequest]:
    """:func:`build_workload` with the sizing options of a command line (``--seed``,
    ``--num-requests``, ``--rate-scale`` unless ``rate_scale`` is given, the token caps
    and ``--param``)."""
    return build_workload(
        name,
        pool,
        seed=args.seed,
        num_requests=args.num_requests,
        rate_scale=args.rate_scale if rate_scale is None else rate_scale,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        overrides=parse_overrides(args.param),
    )


def main_build(args: argparse.Namespace) -> int:
    """CLI entry: build (or read) the pool and generate the case, or cut the trace's
    window; write it."""
    try:
        check_trace_arguments(args)
        output_file(args.out)  # before a pool is tokenized, which takes minutes
        if args.trace:
            if args.trace_rate is not None and len(args.trace_rate) > 1:
                raise ValueError("--trace-rate: one rate per case file")
            if args.pool is not None:
                raise ValueError("--pool: a trace brings its own requests; use --model-dir "
                                 "for the tokenizer")
            tokenizer = load_tokenizer(args.model_dir) if args.model_dir else None
            (requests,) = trace_cases_from_args(args, tokenizer).values()
        else:
            if args.model_dir is None and args.pool is None:
                raise ValueError("--name needs --model-dir or --pool")
            requests = build_workload_from_args(args.name, pool_from_args(args), args)
        write_case(args.out, requests)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {case_summary(requests)}")
    return 0
