"""docs/troubleshooting.md documents every message the plugin stops vLLM's start-up with,
and every warning it logs while serving.

The messages are read from the source with ``ast``: each call of a start-up error class
(and each ``logger.warning``/``error``/``exception``) in the modules that run inside vLLM.
A message is a template: its literal text with a wildcard wherever a value is filled in
(an f-string field, a concatenated expression, a ``%s``); a helper function called in the
message contributes one template per string it returns. The page must show each
template's start, its first :data:`PREFIX_CHARS` literal characters with anything at the
wildcards, on one line or wrapped across lines in the same code block, so a new message
fails this test until it is documented.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fairsched_plugin"
PAGE = ROOT / "docs" / "troubleshooting.md"

TOOLS = ("bench", "experiment", "sim", "model", "data", "demo.py", "cli.py", "cli_help.py",
         "check_config.py", "sharegpt.py", "predictor/cli.py", "predictor/train.py",
         "predictor/export.py", "predictor/evaluate.py", "predictor/dataset.py")
"""The command-line tools: they run outside vLLM, and report their own errors."""

STARTUP_ERRORS = {"ConfigError", "PredictorError", "UnsupportedVllmError"}
"""Raised only where vLLM starts the plugin (configuration, vLLM release and hooks,
latency model), wherever they appear in the serving modules."""

SCOPED_ERRORS = {
    "predictor/memory.py": ({"ValueError", "_Unavailable"}, None),
    "predictor/profiling.py": ({"ProfileError"},
                               {"check_resumable", "_check_header", "_read_meta", "__init__"}),
}
"""Generic errors that are start-up errors in one module, or in some of its functions
(the profile file's, which the scheduler opens at start-up)."""

LOG_METHODS = {"warning", "error", "exception"}
PREFIX_CHARS = 60
WILDCARD = None  # a template part standing for a value filled in at run time


def serving_modules() -> list[Path]:
    def is_tool(path: Path) -> bool:
        relative = path.relative_to(PACKAGE).as_posix()
        return any(relative == tool or relative.startswith(tool + "/") for tool in TOOLS)

    return sorted(p for p in PACKAGE.rglob("*.py") if not is_tool(p))


Template = tuple  # of str parts and WILDCARD


def _merge(parts: list) -> Template:
    """Adjacent literals joined, runs of wildcards collapsed."""
    out: list = []
    for part in parts:
        if part == "" or (part is WILDCARD and out and out[-1] is WILDCARD):
            continue
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        else:
            out.append(part)
    return tuple(out)


@dataclass
class Module:
    """One source file: its string constants and its helpers that return message text."""

    tree: ast.Module
    constants: dict[str, str]
    helpers: dict[str, list[ast.expr]]

    @classmethod
    def read(cls, path: Path, constants: dict[str, str]) -> Module:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        helpers = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                returns = [r.value for r in ast.walk(node)
                           if isinstance(r, ast.Return) and r.value is not None]
                if returns and all(isinstance(r, (ast.JoinedStr, ast.BinOp, ast.Constant))
                                   for r in returns):
                    helpers[node.name] = returns
        return cls(tree, constants, helpers)

    def templates(self, node: ast.expr, depth: int = 0) -> list[Template]:
        """Every message ``node`` can build."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [_printf(node.value)]
        if isinstance(node, ast.Name) and node.id in self.constants:
            return [(self.constants[node.id],)]
        if isinstance(node, ast.JoinedStr):
            choices = [self._field(value, depth) if isinstance(value, ast.FormattedValue)
                       else self.templates(value, depth) for value in node.values]
            return [_merge([p for t in combo for p in t])
                    for combo in itertools.product(*choices)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return [_merge([*left, *right]) for left in self.templates(node.left, depth)
                    for right in self.templates(node.right, depth)]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in self.helpers and depth < 2):
            return [t for r in self.helpers[node.func.id] for t in self.templates(r, depth + 1)]
        return [(WILDCARD,)]

    def _field(self, value: ast.FormattedValue, depth: int) -> list[Template]:
        if value.conversion == -1 and value.format_spec is None:
            return self.templates(value.value, depth)
        if (value.conversion == ord("r") and isinstance(value.value, ast.Name)
                and value.value.id in self.constants):
            return [(repr(self.constants[value.value.id]),)]
        return [(WILDCARD,)]


def _printf(text: str) -> Template:
    """A literal; in a logging format string each ``%s``-style field is a wildcard."""
    parts: list = []
    for i, piece in enumerate(re.split(r"%[-\d.]*[sdrfgx]", text)):
        if i:
            parts.append(WILDCARD)
        parts.append(piece)
    return _merge(parts)


def _constants(paths: list[Path]) -> dict[str, str]:
    """Module-level ``NAME = "text"`` of every serving module (names such as
    ``CONFIG_ENV`` are imported across them)."""
    out = {}
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                out[node.targets[0].id] = node.value.value
    return out


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _functions(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node's innermost enclosing function's name (``ast.walk`` reaches an inner
    function after its parent, so the inner one's name is written last)."""
    owner: dict[ast.AST, str] = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                owner[node] = function.name
    return owner


@dataclass(frozen=True)
class Message:
    where: str
    template: Template

    def literal_prefix(self) -> Template:
        """The template up to its first :data:`PREFIX_CHARS` literal characters."""
        out: list = []
        left = PREFIX_CHARS
        for part in self.template:
            if left <= 0:
                break
            if part is WILDCARD:
                out.append(part)
                continue
            out.append(part[:left])
            left -= len(part)
        while out and out[-1] is WILDCARD:
            out.pop()
        while out and out[0] is WILDCARD:
            out.pop(0)
        return tuple(out)

    def pattern(self) -> re.Pattern[str]:
        prefix = self.literal_prefix()
        pieces = []
        for part in prefix:
            if part is WILDCARD:
                pieces.append(r"[^\n]*?")
            else:
                words = part.split()
                lead = r"\s*" if part[:1].isspace() else ""
                trail = r"\s*" if part[-1:].isspace() else ""
                pieces.append(lead + r"\s+".join(map(re.escape, words)) + trail)
        if prefix == self.template and re.search(r"\w$", prefix[-1]):
            pieces.append(r"(?!\w)")  # a whole message ends where its last word does
        return re.compile("".join(pieces))

    def __str__(self) -> str:
        return self.where + ": " + "".join("…" if p is WILDCARD else p for p in self.template)


def collect() -> list[Message]:
    paths = serving_modules()
    constants = _constants(paths)
    found: dict[Template, Message] = {}
    for path in paths:
        relative = path.relative_to(PACKAGE).as_posix()
        errors, functions = SCOPED_ERRORS.get(relative, (set(), None))
        module = Module.read(path, constants)
        owner = _functions(module.tree)
        for call in ast.walk(module.tree):
            if not isinstance(call, ast.Call) or not call.args:
                continue
            name = _name(call)
            is_log = (name in LOG_METHODS and isinstance(call.func, ast.Attribute)
                      and getattr(call.func.value, "id", "") == "logger")
            is_error = name in STARTUP_ERRORS or (
                name in errors and (functions is None or owner.get(call) in functions))
            if not (is_log or is_error):
                continue
            for template in module.templates(call.args[0]):
                literal = "".join(p for p in template if p is not WILDCARD).strip()
                if literal:  # a bare pass-through (logger.error("%s", exc)) says nothing new
                    message = Message(f"{relative}:{call.lineno}", template)
                    found.setdefault(message.literal_prefix(), message)
    return list(found.values())


MESSAGES = collect()


def _code(text: str) -> str:
    """The page's code: fenced blocks and inline code spans, where messages are quoted."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text,
                                              flags=re.DOTALL | re.MULTILINE))
    return "\n\n".join(blocks + spans)


def test_the_collector_finds_the_start_up_messages():
    texts = [str(m) for m in MESSAGES]
    for expected in ("fairsched config: unknown key", "ONNX Runtime is installed but fails",
                     "cannot hook this vLLM's scheduler", "vLLM-Ascend replaces the scheduler",
                     "is newer than the releases", "latency model …: no such file",
                     "LPRS falls back to the token-budget rule", "is set but the scheduler class",
                     "feature … is … in the model but … here"):
        assert any(expected in text for text in texts), expected


@pytest.mark.parametrize("message", MESSAGES, ids=str)
def test_every_message_is_documented(message: Message):
    code = _code(PAGE.read_text(encoding="utf-8"))
    assert message.pattern().search(code), (
        f"docs/troubleshooting.md has no entry for {message} (show its start, with "
        "anything where a value is filled in, in a code block)")


def test_a_new_message_would_fail():
    """The matching is real: an undocumented template is not found on the page."""
    code = _code(PAGE.read_text(encoding="utf-8"))
    new = Message("new", ("fairsched config: lprs.granularity must divide ", WILDCARD))
    assert not new.pattern().search(code)
