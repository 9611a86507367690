"""Ascend NPU backend. torch_npu registers `torch.npu` when imported, so it is imported
here, lazily: importing it on a machine without Ascend drivers can break torch itself."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

from astrai_core.api import AcceleratorBackend, PluginError


def npu_available() -> bool:
    """True when torch_npu is installed and sees at least one NPU."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    importlib.import_module("torch_npu")
    return bool(torch.npu.is_available())


class NpuBackend(AcceleratorBackend):
    name = "npu"
    type = "npu"
    dist_backend = "hccl"
    ray_resource = "NPU"  # Ray does not detect Ascend NPUs by itself

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        try:
            importlib.import_module("torch_npu")
        except ImportError as exc:
            raise PluginError(
                "device 'npu' needs torch_npu (pip install torch_npu, matching your torch and "
                f"CANN versions): {exc}"
            ) from None

    def process_group_class(self) -> Any:
        """torch_npu's ProcessGroupHCCL."""
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL

        return ProcessGroupHCCL
