"""The CUDA backend (NVIDIA GPUs); distributed runs use NCCL."""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.devices.accelerator import AcceleratorBackend


def cuda_available() -> bool:
    """Probe used by the device spec; imports torch only when asked."""
    return torch.cuda.is_available()


class CudaBackend(AcceleratorBackend):
    name = "cuda"
    type = "cuda"
    dist_backend = "nccl"

    def process_group_class(self) -> Any:
        import torch.distributed as dist

        return dist.ProcessGroupNCCL
