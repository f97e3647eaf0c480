"""The cases an experiment replays, from the command-line options every runner shares.

``fairsched bench`` (a real server), ``fairsched simulate`` and ``fairsched tune`` (the
simulator) draw their cases with the same flags, so the same options build the same
requests everywhere; this module turns those options into cases and into the plugin
settings every plugin arm gets.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..cli_types import positive_int
from ..config import ENV_PREFIX, ConfigError
from .case_files import WorkloadRequest, case_summary, read_case, write_case
from .pairs import PairPool, load_tokenizer, read_pool, write_pool
from .traces import check_trace_arguments, trace_cases_from_args
from .workload_cli import build_pool_from_args, build_workload_from_args
from .workloads import WORKLOADS


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
"""The ordering-policies paper's eight workload categories, in the order of the paper's tables."""


def workload_names(text: str) -> list[str]:
    """``--workload``'s value: generated workload names, comma-separated, ``seed002`` for
    the eight categories of the ordering-policies paper."""
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


def plugin_settings(items: Sequence[str], service: str | None = None,
                    max_batch_size: int | None = None) -> dict[str, str]:
    """``FAIRSCHED_*`` settings shared by every plugin arm: each ``--set KEY=VALUE`` item,
    and the real server's ``--service`` and ``--max-batch-size``."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is not KEY=VALUE")
        key = key.strip()
        if key in PATH_KEYS and value:
            value = str(Path(value).resolve())  # the server runs in its own directory
        settings[ENV_PREFIX + key.replace(".", "_").upper()] = value
    if service:
        settings["FAIRSCHED_SERVICE"] = service
    if max_batch_size is not None:
        settings["FAIRSCHED_MAX_BATCH_SIZE"] = str(max_batch_size)
    return settings
