"""A local Ray started by astrai registers the custom resources the device backends give:
with a fake torch.npu reporting 2 devices, the npu backend (astrai-plugin-npu, found
through the registry) makes it {"NPU": 2}; GPUs and CPUs keep Ray's own detection."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch

from astrai_core.api import process_registry


@pytest.fixture
def two_fake_npus(monkeypatch):
    if not process_registry().has("device_backend", "npu"):
        pytest.skip("astrai-plugin-npu is not installed")
    module = types.ModuleType("torch_npu")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: True,
                                                            device_count=lambda: 2),
                        raising=False)


def test_local_ray_registers_the_npu_count_as_a_custom_resource(two_fake_npus):
    import ray

    from astrai_plugin_ray.cluster import RayConnection, local_ray_resources

    assert local_ray_resources() == {"NPU": 2.0}
    assert not ray.is_initialized()
    connection = RayConnection(None, {"num_cpus": 1})
    try:
        assert connection.started
        assert ray.cluster_resources().get("NPU") == 2.0
    finally:
        connection.close()
    assert not ray.is_initialized()  # started here, so stopped here


def test_cpu_and_cuda_declare_no_custom_resources():
    from astrai_core.api import resolve_device

    assert resolve_device(process_registry(), "cpu").ray_resources() == {}
    from astrai_core.devices.cuda import CudaBackend

    assert CudaBackend().ray_resources() == {}  # Ray detects GPUs itself


def test_a_users_runtime_env_keeps_the_plugin_selection(monkeypatch):
    """init_kwargs.runtime_env is merged with the plugin variables the workers need."""
    import ray

    from astrai_plugin_ray.cluster import RayConnection

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setenv("ASTRAI_PLUGINS", "mine")
    monkeypatch.delenv("ASTRAI_DISABLE_PLUGINS", raising=False)
    user = {"env_vars": {"OMP_NUM_THREADS": "1"}, "worker_process_setup_hook": "m.f"}
    RayConnection(None, {"runtime_env": user, "num_cpus": 1})
    assert seen["runtime_env"] == {"env_vars": {"ASTRAI_PLUGINS": "mine", "OMP_NUM_THREADS": "1"},
                                   "worker_process_setup_hook": "m.f"}
    assert seen["num_cpus"] == 1
    assert user == {"env_vars": {"OMP_NUM_THREADS": "1"}, "worker_process_setup_hook": "m.f"}
    RayConnection(None, {"runtime_env": {"env_vars": {"ASTRAI_PLUGINS": "theirs"}}})
    assert seen["runtime_env"]["env_vars"] == {"ASTRAI_PLUGINS": "theirs"}
