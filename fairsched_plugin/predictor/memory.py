"""Where the four memory features come from: a provider chosen once, at start-up.

The paper's memory features are the GPU's physical used/free memory and the CUDA caching
allocator's allocated/reserved bytes. What the scheduler's process can see of them depends
on the deployment, so three providers measure them, best first:

``torch``
    The model's worker runs in the scheduler's process (vLLM's single-process executor)
    and has initialised its device: ``torch.cuda`` or, on Ascend, ``torch.npu``.
    used/free from ``mem_get_info``; allocated/reserved from ``memory_allocated`` /
    ``memory_reserved``: the paper's exact features. Unavailable when torch is not loaded
    or no device is initialised in this process; a multiprocess executor (tensor or
    pipeline parallelism) leaves the scheduler without one, and initialising one from here
    would take device memory vLLM did not budget for.
``nvml``
    NVIDIA's management library (``pynvml`` from ``nvidia-ml-py``): creates no CUDA
    context and sees every process on the device. used/free are the device's;
    allocated is the memory NVML attributes to this process (0 when the model runs in
    worker processes) and reserved is the device's total used memory.
``kv_cache``
    The KV-cache state the scheduler already holds, from a callable returning
    ``(used_blocks, free_blocks, bytes_per_block)``: used/free are those blocks in MiB,
    allocated = used and reserved = used + free. Works everywhere, costs nothing, and is
    the only provider on a CPU engine.

``auto`` takes the first available of torch, nvml, kv_cache; the provider's ``name`` is
what profiles and models record, so a model trained on one provider's numbers is not
silently served with another's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

from .features import MemoryState

PROVIDER_NAMES = ("torch", "nvml", "kv_cache")
AUTO = "auto"
MIB = float(2**20)

KvState = Callable[[], tuple[int, int, int]]
"""Returns (used_blocks, free_blocks, bytes_per_block) of the scheduler's KV cache."""


class MemoryProvider(Protocol):
    name: str

    def read(self) -> MemoryState: ...


class _Unavailable(Exception):
    """A provider cannot run here; the message says why."""


class TorchDeviceMemory:
    """``torch.cuda`` or ``torch.npu`` of a device this process has initialised."""

    name = "torch"

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._device = backend.current_device()

    def read(self) -> MemoryState:
        free, total = self._backend.mem_get_info(self._device)
        return MemoryState(
            used_mb=(total - free) / MIB,
            free_mb=free / MIB,
            allocated_mb=self._backend.memory_allocated(self._device) / MIB,
            reserved_mb=self._backend.memory_reserved(self._device) / MIB,
        )


class NvmlMemory:
    """One GPU through NVML; allocated is this process's share, reserved the device's."""

    name = "nvml"

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._pid = os.getpid()

    def read(self) -> MemoryState:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        mine = sum(
            process.usedGpuMemory or 0
            for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            if process.pid == self._pid
        )
        return MemoryState(
            used_mb=info.used / MIB,
            free_mb=info.free / MIB,
            allocated_mb=mine / MIB,
            reserved_mb=info.used / MIB,
        )


class KvCacheMemory:
    """The scheduler's KV-cache blocks in MiB: allocated = used, reserved = used + free."""

    name = "kv_cache"

    def __init__(self, kv_state: KvState) -> None:
        self._kv_state = kv_state

    def read(self) -> MemoryState:
        used_blocks, free_blocks, bytes_per_block = self._kv_state()
        used = used_blocks * bytes_per_block / MIB
        free = free_blocks * bytes_per_block / MIB
        return MemoryState(used_mb=used, free_mb=free, allocated_mb=used,
                           reserved_mb=used + free)


def make_memory_provider(name: str, kv_state: KvState | None = None) -> MemoryProvider:
    """The provider ``name`` ("auto", "torch", "nvml" or "kv_cache"); ``kv_state`` is
    needed for kv_cache (and by auto when neither device provider is available).

    An explicitly requested provider that cannot run here raises ``ValueError`` naming it
    and the reason; "auto" never does while ``kv_state`` is given.
    """
    builders: dict[str, Callable[[], MemoryProvider]] = {
        "torch": _torch_provider,
        "nvml": _nvml_provider,
        "kv_cache": lambda: _kv_cache_provider(kv_state),
    }
    if name != AUTO and name not in builders:
        raise ValueError(
            f"unknown memory provider {name!r}; use {AUTO!r} or one of "
            + ", ".join(PROVIDER_NAMES)
        )
    reasons = []
    for candidate in PROVIDER_NAMES if name == AUTO else (name,):
        try:
            return builders[candidate]()
        except _Unavailable as exc:
            reasons.append(f"{candidate}: {exc}")
    raise ValueError(f"memory provider {name!r} is unavailable here ({'; '.join(reasons)})")


def _torch_provider() -> TorchDeviceMemory:
    # Looked up, never imported: if this process has not loaded torch, no worker runs here.
    torch = sys.modules.get("torch")
    if torch is None:
        raise _Unavailable("torch is not loaded in this process")
    for attribute in ("cuda", "npu"):
        backend = getattr(torch, attribute, None)
        is_initialized = getattr(backend, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            return TorchDeviceMemory(backend)
    raise _Unavailable(
        "no CUDA or NPU device is initialised in this process (the model runs in other "
        "processes, or there is no device)"
    )


def _nvml_provider() -> NvmlMemory:
    try:
        import pynvml
    except ImportError:
        raise _Unavailable("pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            raise _Unavailable("NVML sees no GPU")
        handle = _nvml_handle(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    except pynvml.NVMLError as exc:
        raise _Unavailable(f"NVML failed: {exc}") from None
    return NvmlMemory(pynvml, handle)


def _nvml_handle(pynvml: Any, visible: str) -> Any:
    """The handle of this process's first visible GPU. NVML numbers devices physically and
    ignores ``CUDA_VISIBLE_DEVICES``, so the first entry there is translated."""
    first = visible.split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    return pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


def _kv_cache_provider(kv_state: KvState | None) -> KvCacheMemory:
    if kv_state is None:
        raise _Unavailable("no KV-cache state was supplied by the scheduler")
    return KvCacheMemory(kv_state)
