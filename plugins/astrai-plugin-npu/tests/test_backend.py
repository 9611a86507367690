"""The NPU backend without Ascend hardware: it is listed, reports itself unavailable,
fails clearly when chosen, and dispatches to torch.npu when torch_npu is present."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from astrai_core.devices.select import resolve_device
from astrai_core.errors import PluginError
from astrai_core.plugins import load_plugins


def test_npu_is_registered_but_unavailable_here():
    registry = load_plugins()
    spec = registry.get("device_backend", "npu")
    assert spec.priority > registry.get("device_backend", "cpu").priority
    assert spec.is_available() is False
    with pytest.raises(PluginError, match="device 'npu' is not available"):
        resolve_device(registry, "npu")
    assert resolve_device(registry, "auto").name in {"cpu", "cuda"}


@pytest.fixture
def fake_torch_npu(monkeypatch):
    calls = []
    npu = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 8,
        set_device=lambda rank: calls.append(("set_device", rank)),
        synchronize=lambda: calls.append(("synchronize",)),
        manual_seed_all=lambda seed: calls.append(("manual_seed_all", seed)),
        get_rng_state=lambda: torch.tensor([7], dtype=torch.uint8),
        set_rng_state=lambda state: calls.append(("set_rng_state", int(state[0]))),
        memory_allocated=lambda: 10, memory_reserved=lambda: 20, max_memory_allocated=lambda: 30,
        is_bf16_supported=lambda: False,
        empty_cache=lambda: calls.append(("empty_cache",)),
    )
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return calls


def test_backend_dispatches_to_torch_npu(fake_torch_npu):
    from astrai_plugin_npu.backend import NpuBackend

    backend = NpuBackend()
    assert backend.dist_backend == "hccl"
    assert backend.device_count() == 8
    backend.set_device(2)
    backend.manual_seed(5)
    backend.set_rng_state(backend.get_rng_state())
    backend.synchronize()
    assert backend.memory_stats() == {"allocated_bytes": 10.0, "reserved_bytes": 20.0,
                                      "peak_allocated_bytes": 30.0}
    assert backend.supports_bf16() is False
    assert fake_torch_npu == [("set_device", 2), ("manual_seed_all", 5), ("set_rng_state", 7),
                              ("synchronize",)]


def test_npus_become_a_ray_custom_resource(fake_torch_npu):
    """Ray does not detect Ascend NPUs: the backend declares them (the ray plugin registers it)."""
    from astrai_plugin_npu.backend import NpuBackend

    assert NpuBackend().ray_resources() == {"NPU": 8.0}
