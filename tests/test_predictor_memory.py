"""Memory providers. Only kv_cache can run on this CPU machine: the torch and nvml tests
put small fakes of ``torch.cuda``/``torch.npu`` and ``pynvml`` in ``sys.modules`` (the
providers look them up there), and the auto-selection tests hide the real ones."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from fairsched_plugin.predictor.memory import make_memory_provider

MIB = 2**20


def _fake_torch_backend(initialised: bool = True) -> SimpleNamespace:
    """A fake torch.cuda: 16 GiB device, 6 GiB free, 8 GiB allocated, 9 GiB reserved."""
    return SimpleNamespace(
        is_initialized=lambda: initialised,
        current_device=lambda: 1,
        mem_get_info=lambda device: (6 * 1024 * MIB, 16 * 1024 * MIB),
        memory_allocated=lambda device: 8 * 1024 * MIB,
        memory_reserved=lambda device: 9 * 1024 * MIB,
    )


class _FakeNvml:
    """A fake pynvml: one 24 GiB GPU with 10 GiB used, 3 GiB of it by this process."""

    class NVMLError(Exception):
        pass

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.handles: list[object] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        self.handles.append(("index", index))
        return "handle"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:
        self.handles.append(("uuid", uuid))
        return "handle"

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        return SimpleNamespace(used=10 * 1024 * MIB, free=14 * 1024 * MIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=self.pid, usedGpuMemory=3 * 1024 * MIB),
                SimpleNamespace(pid=self.pid + 1, usedGpuMemory=7 * 1024 * MIB)]


@pytest.fixture
def no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither torch nor pynvml visible, whatever this machine has."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "pynvml", None)


def kv_state() -> tuple[int, int, int]:
    return 300, 700, 2 * MIB  # used blocks, free blocks, bytes per block


def test_kv_cache_provider_reads_blocks_in_mib():
    provider = make_memory_provider("kv_cache", kv_state)
    state = provider.read()
    assert provider.name == "kv_cache"
    assert (state.used_mb, state.free_mb) == (600.0, 1400.0)
    assert (state.allocated_mb, state.reserved_mb) == (600.0, 2000.0)


def test_auto_falls_back_to_kv_cache_without_a_device(no_device):
    assert make_memory_provider("auto", kv_state).name == "kv_cache"


def test_auto_without_anything_to_read_names_every_reason(no_device):
    with pytest.raises(ValueError, match="'auto' is unavailable.*torch:.*nvml:.*kv_cache:"):
        make_memory_provider("auto")


def test_explicit_unavailable_provider_is_refused_by_name(no_device):
    with pytest.raises(ValueError, match="memory provider 'torch' is unavailable"):
        make_memory_provider("torch", kv_state)
    with pytest.raises(ValueError, match="memory provider 'nvml' is unavailable.*pynvml"):
        make_memory_provider("nvml", kv_state)


def test_unknown_provider_name_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown memory provider 'gpu'.*torch, nvml, kv_cache"):
        make_memory_provider("gpu", kv_state)


@pytest.mark.parametrize("attribute", ["cuda", "npu"])
def test_torch_provider_reads_an_initialised_device(monkeypatch, attribute):
    other = "npu" if attribute == "cuda" else "cuda"
    fake = SimpleNamespace(**{attribute: _fake_torch_backend(),
                              other: _fake_torch_backend(initialised=False)})
    monkeypatch.setitem(sys.modules, "torch", fake)
    provider = make_memory_provider("auto", kv_state)
    state = provider.read()
    assert provider.name == "torch"
    assert (state.used_mb, state.free_mb) == (10 * 1024, 6 * 1024)
    assert (state.allocated_mb, state.reserved_mb) == (8 * 1024, 9 * 1024)


def test_torch_provider_refuses_a_device_this_process_has_not_initialised(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch",
                        SimpleNamespace(cuda=_fake_torch_backend(initialised=False)))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ValueError, match="torch.*no CUDA or NPU device is initialised"):
        make_memory_provider("torch", kv_state)
    assert make_memory_provider("auto", kv_state).name == "kv_cache"


@pytest.mark.parametrize(
    ("visible", "handle"),
    [("", ("index", 0)), ("3,1", ("index", 3)), ("GPU-8f2e", ("uuid", "GPU-8f2e"))],
)
def test_nvml_provider_reads_the_first_visible_gpu(monkeypatch, visible, handle):
    import os

    nvml = _FakeNvml(os.getpid())
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    provider = make_memory_provider("auto", kv_state)
    state = provider.read()
    assert provider.name == "nvml"
    assert nvml.handles == [handle]
    assert (state.used_mb, state.free_mb) == (10 * 1024, 14 * 1024)
    assert (state.allocated_mb, state.reserved_mb) == (3 * 1024, 10 * 1024)
