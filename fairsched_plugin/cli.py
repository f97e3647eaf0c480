"""The ``fairsched`` command: every verb under one parser.

Only the verb being run is imported: the tools' modules reach vLLM and torch (tens of
seconds on a cold cache) once their arguments and inputs are checked, and ``fairsched
--help`` imports none of them. A verb that meets a missing optional dependency names the
extra that installs it (``extras``) instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .cli_help import FairschedParser
from .extras import missing_extra

GROUPS: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    ("Configuration", (
        ("check-config", "fairsched_plugin.check_config",
         "check settings as vLLM start-up does, without vLLM"),
    )),
    ("Workloads and the tiny test model", (
        ("workload", "fairsched_plugin.experiment.workload_cli",
         "list, build and export benchmark workload cases"),
        ("model", "fairsched_plugin.model.tiny",
         "build the tiny random-weight model the tests serve"),
        ("demo", "fairsched_plugin.demo", "serve the tiny model with fairsched and query it"),
    )),
    ("Benchmarking a real server", (
        ("bench", "fairsched_plugin.bench.cli",
         "replay workloads against vLLM per policy; a report"),
    )),
    ("The latency predictor for LPRS", (
        ("profile", "fairsched_plugin.bench.profile",
         "record per-step latency samples from a server"),
        ("train", "fairsched_plugin.predictor.cli",
         "train the predictor on profiles, export it to ONNX"),
        ("eval-predictor", "fairsched_plugin.predictor.cli",
         "evaluate a predictor on profiles"),
        ("lprs-predictor", "fairsched_plugin.sim.surrogate",
         "write a predictor from config.json, no profiling"),
    )),
    ("Simulation (vLLM's real scheduler on a virtual clock, no server)", (
        ("simulate", "fairsched_plugin.sim.cli", "replay workloads per policy; bench's report"),
        ("capacity", "fairsched_plugin.sim.capacity",
         "find the highest rate stock vLLM sustains"),
        ("suite", "fairsched_plugin.sim.suite",
         "every policy on production traces, devices, loads"),
        ("tune", "fairsched_plugin.sim.tune", "search policies and settings for a workload"),
    )),
)
"""(group title, ((verb, the module whose ``add_cli`` registers it, one line), ...))."""

VERBS = {verb: module for _, verbs in GROUPS for verb, module, _ in verbs}


def _description() -> str:
    lines = [
        "Fair prefill scheduling for vLLM, and the tools to check, measure and tune it.",
        "",
        "Serving needs no verb: install this package in vLLM's environment and start vLLM "
        "with\n--scheduler-cls fairsched_plugin.FairScheduler (or with FAIRSCHED_POLICY set). "
        "Settings\ncome from --additional-config '{\"fairsched\": {...}}' and the "
        "FAIRSCHED_* variables.",
        "",
    ]
    for title, verbs in GROUPS:
        lines.append(f"{title}:")
        lines += [f"  {verb:<15} {line}" for verb, _, line in verbs]
    lines += ["", "Run fairsched VERB -h for a verb's options."]
    return "\n".join(lines)


def _parser(modules: list[str]) -> argparse.ArgumentParser:
    """The top-level parser with the verbs of ``modules`` registered in full; the others
    are listed in the description only."""
    parser = FairschedParser(prog="fairsched", description=_description())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="VERB")
    for module in dict.fromkeys(modules):
        importlib.import_module(module).add_cli(subparsers)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The whole command, every verb registered (imports every tool's module)."""
    return _parser(list(VERBS.values()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = argv[0] if argv else None
    if verb not in VERBS:
        parser = _parser([])
        if verb is None or verb.startswith("-"):
            parser.parse_args(argv)  # --help prints and exits; nothing is an error
        parser.error(f"unknown verb {verb!r}; verbs: {', '.join(VERBS)}")
    args = _parser([VERBS[verb]]).parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:
        hint = missing_extra(exc)
        if hint is None:
            raise
        print(f"error: fairsched {verb}: {hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
