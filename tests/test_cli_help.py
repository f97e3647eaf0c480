"""Every ``fairsched`` verb and option explains itself: walks the real parser, every
sub-command and sub-sub-command."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from fairsched_plugin.cli import build_parser
from fairsched_plugin.cli_help import has_default, help_with_default


def _subparser_actions(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _commands(parser: argparse.ArgumentParser, path: str = "fairsched"
              ) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """(command path, parser, its one-line help in the list above it) for every
    (sub-)command below ``parser``."""
    for action in _subparser_actions(parser):
        listed = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            yield f"{path} {name}", sub, listed.get(name)
            yield from _commands(sub, f"{path} {name}")


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


PARSER = build_parser()
COMMANDS = list(_commands(PARSER))


def test_the_walk_reaches_every_level():
    names = {path for path, _, _ in COMMANDS}
    assert {"fairsched check-config", "fairsched model tiny", "fairsched workload pool",
            "fairsched bench", "fairsched lprs-predictor", "fairsched suite"} <= names


@pytest.mark.parametrize("path, parser, listed", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_has_a_help_line_and_a_description(path, parser, listed):
    assert listed and listed.strip(), f"{path}: no help= in the list of its parent"
    assert parser.description and parser.description.strip(), f"{path}: no description="


@pytest.mark.parametrize("path, parser, listed", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_option_has_help_and_shows_its_default(path, parser, listed):
    for action in _options(parser):
        name = "/".join(action.option_strings)
        assert action.help and action.help.strip(), f"{path} {name}: no help="
        if has_default(action):
            assert "default" in help_with_default(action), f"{path} {name}: default not shown"
    parser.format_help()  # every help string formats (a stray % would raise here)


def test_top_level_description_names_every_verb():
    description = PARSER.description
    (verbs,) = _subparser_actions(PARSER)
    for name in verbs.choices:
        assert re.search(rf"^  {re.escape(name)} ", description, re.MULTILINE), (
            f"{name} missing from fairsched --help")
    assert "--scheduler-cls fairsched_plugin.FairScheduler" in description


def test_a_default_is_shown_once():
    parser = argparse.ArgumentParser()
    plain = parser.add_argument("--x", type=int, default=3, help="a number")
    stated = parser.add_argument("--y", default=None, help="a path (default: none)")
    flag = parser.add_argument("--z", action="store_true", help="a switch")
    repeated = parser.add_argument("--w", action="append", default=[], help="repeatable")
    assert help_with_default(plain) == "a number (default: 3)"
    assert help_with_default(stated) == "a path (default: none)"
    assert help_with_default(flag) == "a switch"
    assert help_with_default(repeated) == "repeatable"
