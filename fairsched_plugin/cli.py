"""The ``fairsched`` command: build the tiny model and workloads, benchmark policies."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import demo
    from .bench import cli as bench_cli
    from .bench import workloads
    from .bench import profile as bench_profile
    from .model import tiny
    from .predictor import cli as predictor_cli
    from .sim import capacity
    from .sim import cli as sim_cli
    from .sim import suite
    from .sim import surrogate
    from .sim import tune as sim_tune

    parser = argparse.ArgumentParser(prog="fairsched", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    tiny.add_cli(subparsers)
    demo.add_cli(subparsers)
    workloads.add_cli(subparsers)
    bench_cli.add_cli(subparsers)
    bench_profile.add_cli(subparsers)
    predictor_cli.add_cli(subparsers)
    sim_cli.add_cli(subparsers)
    sim_tune.add_cli(subparsers)
    capacity.add_cli(subparsers)
    suite.add_cli(subparsers)
    surrogate.add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
