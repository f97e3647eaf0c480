"""The configuration's layers import one way: ``settings`` (the sections' dataclasses) at
the bottom, the policies above it, the policy registry above them, ``config`` (loading
and checks, which reads the registry's names) on top.

Checked from the source, so a function-level import cannot hide a cycle again, and by
importing each module first in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fairsched_plugin"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for every import in ``path``,
    relative ones resolved; ``from X import a`` lists ``X`` and ``X.a`` (a may be a
    module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.append((base, child.lineno, in_function))
                found.extend((f"{base}.{alias.name}", child.lineno, in_function)
                             for alias in child.names)
            visit(child, in_function
                  or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def _own(imports: list[tuple[str, int, bool]]) -> list[tuple[str, int, bool]]:
    return [entry for entry in imports if entry[0].split(".")[0] == "fairsched_plugin"]


def _is(module: str, target: str) -> bool:
    return module == target or module.startswith(target + ".")


def test_the_import_resolver_reads_relative_imports():
    imports = _imports(PACKAGE / "policies" / "registry.py")
    assert any(_is(name, "fairsched_plugin.settings") for name, _line, _f in imports)
    assert any(_is(name, "fairsched_plugin.policies.af_lcb") for name, _line, _f in imports)


def test_settings_import_nothing_of_the_package():
    assert _own(_imports(PACKAGE / "settings.py")) == []


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "policies").glob("*.py")), ids=lambda path: path.name)
def test_policies_never_import_config(path: Path):
    """The policies take their sections from ``settings``; ``config`` is above them."""
    wrong = [(name, line) for name, line, _f in _imports(path)
             if _is(name, "fairsched_plugin.config")]
    assert not wrong, f"{path.name} imports the config loader: {wrong}"


@pytest.mark.parametrize("module", ["config.py", "settings.py", "policies/registry.py",
                                    "policies/af_lcb.py"])
def test_no_deferred_imports_of_the_package(module: str):
    """With the layers one way, nothing has to be imported late to dodge a cycle."""
    deferred = [(name, line) for name, line, in_function in _own(_imports(PACKAGE / module))
                if in_function]
    assert not deferred, deferred


@pytest.mark.parametrize("module", ["fairsched_plugin.config", "fairsched_plugin.settings",
                                    "fairsched_plugin.policies.registry",
                                    "fairsched_plugin.policies.af_lcb"])
def test_each_module_imports_first_in_a_fresh_interpreter(module: str):
    """Each of the three, imported before anything else of the package, loads a config."""
    code = (f"import {module}; import fairsched_plugin.config as c;"
            "assert c.policy_names() and c.load_config({}, environ={}).policy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
