"""The package's layers import one way.

The configuration: ``settings`` (the sections' dataclasses) at the bottom, the policies
above it, the policy registry above them, ``config`` (loading and checks, which reads the
registry's names) on top. The packages: the runtime (what ``--scheduler-cls`` loads) below
the simulator and the benchmark, with no loop between any two packages.

Checked from the source, so a function-level import cannot hide a cycle again, by
``lint-imports`` with the contracts in ``pyproject.toml``, and by importing in a fresh
interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
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


def _package_of(module: str) -> str:
    """The first level under ``fairsched_plugin`` (a subpackage or a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_two_packages_import_each_other():
    """No loop between packages, however long: each package's reach (following every
    import, deferred ones included) must not lead back to it."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _package_of(_module_name(path))
        for name, _line, _f in _own(_imports(path)):
            target = _package_of(name)
            if target != source and ((PACKAGE / target).is_dir()
                                     or (PACKAGE / f"{target}.py").exists()):
                edges[source].add(target)
    for start in list(edges):
        seen, todo = set(), list(edges[start])
        while todo:
            package = todo.pop()
            if package not in seen:
                seen.add(package)
                todo.extend(edges[package])
        assert start not in seen, f"{start} imports itself back through {sorted(seen)}"


def test_the_serving_path_loads_no_simulator_and_no_benchmark():
    """What ``--scheduler-cls fairsched_plugin.FairScheduler`` and the general plugin
    load, in a fresh interpreter: no module of ``sim`` or ``bench``."""
    code = ("import sys; from fairsched_plugin import FairScheduler, FairSyncScheduler;"
            "import fairsched_plugin.plugin, fairsched_plugin.metrics.exporter;"
            "print(' '.join(m for m in sys.modules if m.startswith('fairsched_plugin.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert "fairsched_plugin.adapter.scheduler" in loaded
    wrong = [m for m in loaded if _package_of(m) in ("sim", "bench")]
    assert not wrong, wrong


def test_the_import_contracts_hold():
    """``lint-imports`` (import-linter) with the contracts in ``pyproject.toml``."""
    tool = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(tool)], capture_output=True, text=True,
                            cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
