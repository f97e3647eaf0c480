"""The user documentation stays user documentation: no development history, no dead links,
no ``fairsched`` command the CLI would refuse.

The pages are read by operators deciding what to set; a session number, a commit hash or a
link to a moved results folder tells them nothing, and a command that argparse rejects
fails the first time they paste it.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from fairsched_plugin.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
USER_PAGES = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]
)
LINKED_PAGES = [*USER_PAGES, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks/results/README.md"]

HISTORY_WORDS = {
    # (A trace's `session` field and a `chat-sessions-open` scenario, in code, are not one.)
    "a session": re.compile(r"(?<![`\w-])sessions?(?![`\w-])", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a day's luck": re.compile(r"\b(faster|slower|quieter|busier) day\b", re.IGNORECASE),
    "a development round": re.compile(r"\b[a-z][a-z0-9-]*-s\d{2}b?\b"),
    "a commit hash": re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"),
}

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`(fairsched [^`]+)`")


def _strip_code(text: str) -> str:
    """The prose of a page: fenced blocks hold commands and logs, not claims."""
    return FENCE.sub("", text)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_development_history(page: Path) -> None:
    text = _strip_code(page.read_text())
    found = [
        f"{what}: {m.group(0)!r} (line {text[:m.start()].count(chr(10)) + 1})"
        for what, pattern in HISTORY_WORDS.items()
        for m in pattern.finditer(text)
    ]
    assert not found, f"{page.name} reads like a lab notebook: " + "; ".join(found)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for m in LINK.finditer(_strip_code(page.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{page.name} links nowhere: " + "; ".join(broken)


def _doc_commands(page: Path) -> list[str]:
    """Every ``fairsched ...`` invocation a reader could copy from a page. Inline code that
    only names a verb (`fairsched tune`) is a reference, checked by :func:`_verbs_exist`."""
    text = page.read_text()
    commands = [m.group(1) for m in INLINE_CODE.finditer(_strip_code(text))
                if any(word.startswith("-") for word in m.group(1).split())]
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|\|\||;|\|", line):
                words = part.strip().split()
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words.pop(0)
                if words and words[0].endswith("fairsched") and not words[0].endswith("/fairsched_plugin"):
                    commands.append(" ".join(["fairsched", *words[1:]]))
    return commands


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def test_verbs_named_in_prose_exist() -> None:
    unknown = []
    for page in USER_PAGES:
        for m in INLINE_CODE.finditer(_strip_code(page.read_text())):
            words = m.group(1).split()
            parser = build_parser()
            for word in words[1:]:
                verbs = _verbs(parser)
                if not verbs or word.startswith("-"):
                    break
                if word not in verbs:
                    unknown.append(f"{page.name}: `{m.group(1)}`")
                    break
                parser = verbs[word]
    assert not unknown, "no such verb: " + "; ".join(unknown)


COMMANDS = [(page, cmd) for page in USER_PAGES for cmd in _doc_commands(page)]


def test_docs_show_commands() -> None:
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(
    "page,command", COMMANDS,
    ids=[f"{p.relative_to(ROOT).as_posix()}:{c[:60]}" for p, c in COMMANDS],
)
def test_doc_commands_parse(page: Path, command: str, capsys: pytest.CaptureFixture) -> None:
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:
            return
        message = capsys.readouterr().err.strip().splitlines()[-1:]
        raise AssertionError(f"{page.name}: `{command}` is refused: {message}") from exc


def test_every_benchmark_script_is_listed_with_what_it_answers():
    """A script in ``benchmarks/`` is a documented tool or it goes."""
    listed = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    missing = [path.name for path in sorted((ROOT / "benchmarks").glob("*.py"))
               if f"| `{path.name}` |" not in listed]
    assert not missing, missing
