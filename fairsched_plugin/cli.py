"""The ``fairsched`` command: every verb under one parser.

``check-config`` is parsed before the other verbs are registered: their modules import
vLLM and torch when they load (tens of seconds on a cold cache), which a configuration
check run before a restart should not wait for.
"""

from __future__ import annotations

import argparse
import sys

from . import check_config
from .cli_help import FairschedParser

DESCRIPTION = """\
Fair prefill scheduling for vLLM, and the tools to check, measure and tune it.

Serving needs no verb: install this package in vLLM's environment and start vLLM with
--scheduler-cls fairsched_plugin.FairScheduler (or with FAIRSCHED_POLICY set). Settings
come from --additional-config '{"fairsched": {...}}' and the FAIRSCHED_* variables.

Configuration:
  check-config    check settings as vLLM start-up does, without vLLM
Workloads and the tiny test model:
  workload        list, build and export benchmark workload cases
  model tiny      build the tiny random-weight model the tests serve
  demo            serve the tiny model with fairsched and query it
Benchmarking a real server:
  bench           replay workloads against vLLM per policy; a report
The latency predictor for LPRS:
  profile         record per-step latency samples from a server
  train           train the predictor on profiles, export it to ONNX
  eval-predictor  evaluate a predictor on profiles
  lprs-predictor  write a predictor from config.json, no profiling
Simulation (vLLM's real scheduler on a virtual clock, no server):
  simulate        replay workloads per policy; bench's report
  capacity        find the highest rate stock vLLM keeps up with
  suite           every policy on production traces, devices, loads
  tune            search policies and settings for a workload

Run fairsched VERB -h for a verb's options."""


def _top_level() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = FairschedParser(prog="fairsched", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="VERB")
    check_config.add_cli(subparsers)
    return parser, subparsers


def build_parser() -> argparse.ArgumentParser:
    """The whole command: every verb, in the groups of :data:`DESCRIPTION`."""
    from . import demo
    from .bench import cli as bench_cli
    from .bench import profile as bench_profile
    from .bench import workloads
    from .model import tiny
    from .predictor import cli as predictor_cli
    from .sim import capacity
    from .sim import cli as sim_cli
    from .sim import suite
    from .sim import surrogate
    from .sim import tune as sim_tune

    parser, subparsers = _top_level()
    for module in (workloads, tiny, demo, bench_cli, bench_profile, predictor_cli, surrogate,
                   sim_cli, capacity, suite, sim_tune):
        module.add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _top_level()[0] if argv[:1] == [check_config.VERB] else build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
