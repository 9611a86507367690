"""The CUDA backend (NVIDIA GPUs); distributed runs use NCCL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from astrai_core.devices.base import DeviceBackend


def cuda_available() -> bool:
    """Probe used by the device spec; imports torch only when asked."""
    return torch.cuda.is_available()


class CudaBackend(DeviceBackend):
    name = "cuda"
    type = "cuda"
    dist_backend = "nccl"

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def set_device(self, local_rank: int) -> None:
        torch.cuda.set_device(local_rank)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor | None:
        return torch.cuda.get_rng_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        if state is not None:
            torch.cuda.set_rng_state(state)

    def memory_stats(self) -> dict[str, float]:
        return {
            "allocated_bytes": float(torch.cuda.memory_allocated()),
            "reserved_bytes": float(torch.cuda.memory_reserved()),
            "peak_allocated_bytes": float(torch.cuda.max_memory_allocated()),
        }

    def supports_bf16(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def process_group(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
        import torch.distributed as dist

        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
