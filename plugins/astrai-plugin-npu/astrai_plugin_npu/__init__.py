"""astrai-plugin-npu: the Ascend NPU device backend (torch_npu is imported only when used)."""

from astrai_core import DeviceBackendSpec, hookimpl


@hookimpl
def astrai_device_backends():
    return [
        DeviceBackendSpec(
            name="npu",
            target="astrai_plugin_npu.backend:NpuBackend",
            summary="Huawei Ascend NPUs through torch_npu; distributed runs over HCCL",
            available="astrai_plugin_npu.backend:npu_available",
            priority=90,
        )
    ]
