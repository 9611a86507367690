"""The backend of an accelerator family driven by its own torch module (``torch.cuda``,
``torch.npu``, ...).

The families differ in names only: the torch device type (which names the module), the
collective library of distributed runs, the class of a stand-alone process group, and
whether Ray detects the devices itself. A family subclasses :class:`AcceleratorBackend`
with those; everything else asks ``torch.<type>``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import torch

from astrai_core.devices.base import DeviceBackend


class AcceleratorBackend(DeviceBackend):
    """Device calls dispatched to ``torch.<type>``; see the module docstring."""

    # A custom Ray resource naming these devices, for a family Ray does not detect itself
    # (Ascend NPUs: "NPU"); None when Ray counts them on its own (CUDA GPUs).
    ray_resource: ClassVar[str | None] = None

    @property
    def device_module(self) -> Any:
        """``torch.<type>`` (registered by an extension package for some families)."""
        return getattr(torch, self.type)

    def process_group_class(self) -> Any:
        """The torch.distributed process-group class of :attr:`dist_backend`."""
        raise NotImplementedError

    def device_count(self) -> int:
        return self.device_module.device_count()

    def set_device(self, local_rank: int) -> None:
        self.device_module.set_device(local_rank)

    def synchronize(self) -> None:
        self.device_module.synchronize()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.device_module.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor | None:
        return self.device_module.get_rng_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        if state is not None:
            self.device_module.set_rng_state(state)

    def memory_stats(self) -> dict[str, float]:
        module = self.device_module
        return {
            "allocated_bytes": float(module.memory_allocated()),
            "reserved_bytes": float(module.memory_reserved()),
            "peak_allocated_bytes": float(module.max_memory_allocated()),
        }

    def available_memory(self) -> int | None:
        probe = getattr(self.device_module, "mem_get_info", None)
        return int(probe()[0]) if probe is not None else None  # (free, total)

    def supports_bf16(self) -> bool:
        probe = getattr(self.device_module, "is_bf16_supported", None)
        return bool(probe()) if probe is not None else True

    def empty_cache(self) -> None:
        self.device_module.empty_cache()

    def ray_resources(self) -> dict[str, float]:
        if self.ray_resource is None:
            return {}
        count = self.device_count()
        return {self.ray_resource: float(count)} if count else {}

    def process_group(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
        group_class = self.process_group_class()
        options = group_class.Options()
        options._timeout = timeout
        return group_class(store, rank, world_size, options)
