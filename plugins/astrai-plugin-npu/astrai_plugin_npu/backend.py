"""Ascend NPU backend. torch_npu registers `torch.npu` when imported, so it is imported
here, lazily: importing it on a machine without Ascend drivers can break torch itself."""

from __future__ import annotations

import importlib
import importlib.util
from datetime import timedelta
from typing import Any

import torch

from astrai_core.api import DeviceBackend
from astrai_core.api import PluginError


def npu_available() -> bool:
    """True when torch_npu is installed and sees at least one NPU."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    importlib.import_module("torch_npu")
    return bool(torch.npu.is_available())


class NpuBackend(DeviceBackend):
    name = "npu"
    type = "npu"
    dist_backend = "hccl"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        try:
            importlib.import_module("torch_npu")
        except ImportError as exc:
            raise PluginError(
                "device 'npu' needs torch_npu (pip install torch_npu, matching your torch and "
                f"CANN versions): {exc}"
            ) from None
        self._npu = torch.npu

    def device_count(self) -> int:
        return self._npu.device_count()

    def set_device(self, local_rank: int) -> None:
        self._npu.set_device(local_rank)

    def synchronize(self) -> None:
        self._npu.synchronize()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._npu.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor | None:
        return self._npu.get_rng_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        if state is not None:
            self._npu.set_rng_state(state)

    def memory_stats(self) -> dict[str, float]:
        return {
            "allocated_bytes": float(self._npu.memory_allocated()),
            "reserved_bytes": float(self._npu.memory_reserved()),
            "peak_allocated_bytes": float(self._npu.max_memory_allocated()),
        }

    def supports_bf16(self) -> bool:
        probe = getattr(self._npu, "is_bf16_supported", None)
        return bool(probe()) if probe is not None else True

    def empty_cache(self) -> None:
        self._npu.empty_cache()

    def ray_resources(self) -> dict[str, float]:
        """Ray does not detect Ascend NPUs by itself: they become the custom resource "NPU"."""
        count = self.device_count()
        return {"NPU": float(count)} if count else {}

    def process_group(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
        """A stand-alone HCCL group (torch_npu's ProcessGroupHCCL)."""
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL

        options = ProcessGroupHCCL.Options()
        options._timeout = timeout
        return ProcessGroupHCCL(store, rank, world_size, options)
