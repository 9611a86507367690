"""astrai-core's own components, registered through the same hooks as any plugin."""

from __future__ import annotations

from astrai_core.hookspecs import hookimpl
from astrai_core.specs import (
    DeviceBackendSpec,
)


@hookimpl
def astrai_device_backends() -> list[DeviceBackendSpec]:
    return [
        DeviceBackendSpec(name="cpu", target="astrai_core.devices.cpu:CpuBackend",
                          summary="CPU; distributed runs over gloo", priority=0),
        DeviceBackendSpec(name="cuda", target="astrai_core.devices.cuda:CudaBackend",
                          summary="NVIDIA GPUs; distributed runs over NCCL",
                          available="astrai_core.devices.cuda:cuda_available", priority=100),
    ]
