"""What ``vllm serve`` picks on a device when the user sets nothing: the token budget and
sequence limit from the installed vLLM's own defaults logic, the KV block size, and
whether the engine runs async.

vLLM chooses ``max_num_batched_tokens`` and ``max_num_seqs`` in
``EngineArgs.get_batch_defaults`` from the platform's device memory and name (H100 and
H200: 8192 / 1024 for the OpenAI server; A100 and smaller: 2048 / 256). Here that very
function runs with the platform reporting the simulated device, so a newer vLLM's
choices follow it. vLLM-Ascend's platform does not report device memory (its
``get_device_total_memory`` raises), so vLLM falls back to its generic defaults there;
vLLM-Ascend uses 128-token KV blocks. vLLM turns async scheduling on by default wherever
its executor supports it (single-device serving on GPUs and NPUs alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

GIB = 1 << 30


@dataclass(frozen=True)
class Device:
    """A simulated device: the analytic preset and how its platform presents itself."""

    preset: str
    device_name: str
    memory_bytes: int | None
    """What the platform reports; None where it raises (vLLM-Ascend)."""
    block_size: int = 16
    async_scheduling: bool = True


DEVICES: dict[str, Device] = {
    "h100": Device("h100", "NVIDIA H100 80GB HBM3", 80 * GIB),
    "a100-80gb": Device("a100-80gb", "NVIDIA A100-SXM4-80GB", 80 * GIB),
    "h200": Device("h200", "NVIDIA H200", 141 * GIB),
    "ascend910b": Device("ascend910b", "Ascend910B2", None, block_size=128),
    "rtx4090": Device("rtx4090", "NVIDIA GeForce RTX 4090", 24 * GIB),
    "rtxpro5000": Device("rtxpro5000", "NVIDIA RTX PRO 5000 Blackwell", 72 * GIB),
}


@dataclass(frozen=True)
class ServeDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    async_scheduling: bool


class _Platform:
    """Answers the questions ``get_batch_defaults`` asks of ``current_platform``."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def get_device_total_memory(self, device_id: int = 0) -> int:
        if self.device.memory_bytes is None:
            raise NotImplementedError
        return self.device.memory_bytes

    def get_device_name(self, device_id: int = 0) -> str:
        return self.device.device_name

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


def serve_defaults(preset: str) -> ServeDefaults:
    """``vllm serve``'s defaults on the device of ``preset`` (one GPU, no parallelism)."""
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext

    device = DEVICES.get(preset)
    if device is None:
        raise ValueError(f"no serve defaults for {preset!r}; devices: {', '.join(DEVICES)}")
    with mock.patch.object(arg_utils, "current_platform", _Platform(device)):
        tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    server = UsageContext.OPENAI_API_SERVER
    return ServeDefaults(tokens[server], seqs[server], device.block_size,
                         device.async_scheduling)
