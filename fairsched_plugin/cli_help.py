"""How every ``fairsched`` command lays out its help: each option's default is shown, and
descriptions keep their paragraphs, headings and indented lists.

argparse builds a sub-command's parser with the class of the parser above it, so a
top-level :class:`FairschedParser` gives every sub-command and sub-sub-command this
layout without each ``add_cli`` naming it.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any


def has_default(action: argparse.Action) -> bool:
    """Whether the option has a default worth showing: not a flag (whose default is just
    "off"), not required, not an empty repeatable list, not None."""
    default = action.default
    if action.nargs == 0 or action.required or default in (None, argparse.SUPPRESS):
        return False
    return not (isinstance(default, (list, tuple)) and not default)


def states_default(help_text: str) -> bool:
    """Whether a help text already says what the default is, in its own words."""
    return any(marker in help_text for marker in ("%(default)", "(default", "default:"))


def help_with_default(action: argparse.Action) -> str:
    """The option's help, with ``(default: VALUE)`` added unless it says it already."""
    help_text = action.help or ""
    if not has_default(action) or states_default(help_text):
        return help_text
    # The help is %-formatted later: a literal % in the value must survive that.
    shown = _shown(action.default).replace("%", "%%")
    return f"{help_text} (default: {shown})"


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


class HelpFormatter(argparse.HelpFormatter):
    """Defaults in every option's help; paragraphs wrapped, indented lines kept as items."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return help_with_default(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = textwrap.dedent(text).strip().split("\n\n")
        return "\n\n".join(_fill_paragraph(p, width, indent) for p in paragraphs)


def _fill_paragraph(paragraph: str, width: int, indent: str) -> str:
    """Plain lines run together and wrap; a line that starts with spaces is an item of its
    own, wrapped under itself (under its text, past a leading "- ")."""
    blocks: list[str] = []
    for line in paragraph.split("\n"):
        if blocks and not line[:1].isspace() and not blocks[-1][:1].isspace():
            blocks[-1] += " " + line.strip()
        else:
            blocks.append(line.rstrip())
    out = []
    for block in blocks:
        text = block.lstrip()
        lead = indent + " " * (len(block) - len(text))
        hang = lead + ("  " if text.startswith("- ") else "")
        out.append(textwrap.fill(text, width, initial_indent=lead, subsequent_indent=hang))
    return "\n".join(out)


class FairschedParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` laid out by :class:`HelpFormatter` unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
