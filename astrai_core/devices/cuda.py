"""The CUDA backend (NVIDIA GPUs); distributed runs use NCCL."""

from __future__ import annotations

import os
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

    def loopback_env(self, interface: str) -> dict[str, str]:
        # NCCL picks its bootstrap interface once per process: a value set by the user
        # (e.g. for a weight-push group to rollout workers on other machines) is kept
        env = super().loopback_env(interface)
        if "NCCL_SOCKET_IFNAME" not in os.environ:
            env["NCCL_SOCKET_IFNAME"] = interface
        return env
