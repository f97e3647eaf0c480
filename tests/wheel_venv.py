"""A fresh virtual environment holding a given vLLM and fairsched from a wheel built from
this checkout's sdist: for the packaging and the old-vLLM end-to-end tests.

The new venv sees an existing environment's packages through a directory of links that
leaves out fairsched (so no checkout or editable install can be imported) and ONNX
Runtime (so the base install is what runs): vLLM and its dependencies without installing
gigabytes again. fairsched comes only from the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = ("fairsched", "__editable__", "onnxruntime", "onnx", "_virtualenv")
"""Entries of the source environment a fresh "vLLM only" environment must not see."""


def without_pythonpath() -> dict[str, str]:
    """This process's environment minus PYTHONPATH, which would put a checkout first."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def build_dists(out: Path) -> tuple[Path, Path]:
    """The sdist of this checkout and the wheel built from that sdist, into ``out``.

    ``python -m build`` as a release runs it, so a file the wheel build needs but the sdist
    leaves out fails here. No build isolation: setuptools comes from this venv, so nothing
    is downloaded."""
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                             str(out), str(ROOT)], capture_output=True, text=True,
                            timeout=600, env=without_pythonpath())
    if result.returncode != 0:
        raise RuntimeError(f"python -m build failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return next(out.glob("fairsched_plugin-*.tar.gz")), next(out.glob("fairsched_plugin-*.whl"))


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built from its sdist (:func:`build_dists`)."""
    return build_dists(out)[1]


def _linked_site(source: Path, farm: Path) -> Path:
    farm.mkdir()
    for entry in source.iterdir():
        if not entry.name.lower().startswith(LEFT_OUT) and not entry.name.endswith(".pth"):
            (farm / entry.name).symlink_to(entry)
    return farm


def purelib(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True,
                          env=without_pythonpath()).stdout.strip()


def fresh_venv(tmp: Path, base_python: str, wheel: Path) -> str:
    """A venv made by ``base_python`` seeing ``base_python``'s packages minus LEFT_OUT,
    with ``wheel`` installed; returns its python, after checking fairsched comes from it."""
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(tmp / "venv")],
                   check=True, env=without_pythonpath())
    python = str(tmp / "venv" / "bin" / "python")
    site = purelib(python)
    farm = _linked_site(Path(purelib(base_python)), tmp / "vllm-only-site")
    (Path(site) / "vllm-only.pth").write_text(f"{farm}\n")
    # pip runs from this venv, installing into the new one: --no-index, and the
    # dependencies (numpy, packaging) must already be there, through the links.
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index",
                    "-q", str(wheel)], check=True, timeout=600, env=without_pythonpath())
    where = subprocess.run([python, "-c", "import fairsched_plugin; "
                            "print(fairsched_plugin.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp,
                           env=without_pythonpath()).stdout
    assert where.startswith(site), where  # fairsched from the wheel, not a checkout
    return python
