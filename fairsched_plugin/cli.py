"""The ``fairsched`` command: build the tiny model, run the demo."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import demo
    from .model import tiny

    parser = argparse.ArgumentParser(prog="fairsched", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    tiny.add_cli(subparsers)
    demo.add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
