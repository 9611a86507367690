"""The device backend interface.

Code never hard-codes a device family: it asks the backend for the device, the
distributed backend, synchronisation, RNG state, memory figures and autocast.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict


class DeviceBackend:
    """Base class; a backend overrides what differs for its device family."""

    name: str = ""
    type: str = ""                 # torch device type: "cpu", "cuda", "npu", ...
    dist_backend: str = "gloo"     # torch.distributed backend for this family

    class Config(BaseModel):
        """Options of the `device:` config section (none by default)."""

        model_config = ConfigDict(extra="forbid")

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device(self.type, local_rank) if self.type != "cpu" else torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, local_rank: int) -> None:
        """Make ``local_rank`` the current device of this process."""

    def synchronize(self) -> None:
        """Wait for queued work on the device to finish."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor | None:
        """The device generator's state (None when the device has none of its own)."""
        return None

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        """Restore what :meth:`get_rng_state` returned."""

    def memory_stats(self) -> dict[str, float]:
        """Allocated / reserved / peak memory in bytes, where the device reports it."""
        return {}

    def available_memory(self) -> int | None:
        """Bytes free for a run on one device (None: the device does not say); the run
        plan refuses sizes whose activations could not fit it by a wide margin."""
        return None

    def supports_bf16(self) -> bool:
        return True

    def autocast(self, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
        """Mixed-precision context for this device; a no-op for ``None``/float32."""
        if dtype is None or dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.type, dtype=dtype)

    def empty_cache(self) -> None:
        """Return cached memory to the device."""

    def ray_resources(self) -> dict[str, float]:
        """Ray custom resources for this machine's devices of this family, registered when
        astrai starts a local Ray (e.g. ``{"NPU": 8}``). Empty when Ray detects the devices
        itself (CPUs, CUDA GPUs) or the family has none here."""
        return {}

    def loopback_env(self, interface: str) -> dict[str, str]:
        """Environment variables that keep this family's collective library listening on
        ``interface`` (the loopback one) while the process group of a run whose ranks all
        share this machine is created. The base (gloo) names its socket interface."""
        return {"GLOO_SOCKET_IFNAME": interface}

    def process_group(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
        """A stand-alone collective group of :attr:`dist_backend` over ``store``, apart from
        the default group (e.g. the trainer-to-rollout-workers group of the ray sampler).
        Its ``broadcast`` moves tensors on :meth:`device`; the base group is gloo (CPU)."""
        import torch.distributed as dist

        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
