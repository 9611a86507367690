"""Choosing a device backend by name (``auto`` picks the best available one)."""

from __future__ import annotations

from typing import Any

from astrai_core.devices.base import DeviceBackend
from astrai_core.errors import PluginError
from astrai_core.plugins.registry import Registry
from astrai_core.plugins.specs import DeviceBackendSpec


def resolve_device(registry: Registry, name: str = "auto", **params: Any) -> DeviceBackend:
    """Build the backend called ``name``; ``auto`` takes the highest-priority available."""
    if name == "auto":
        candidates = [s for s in registry.specs("device_backend") if s.is_available()]
        if not candidates:
            raise PluginError("no device backend is available (not even cpu)")
        spec = max(candidates, key=lambda s: s.priority)
    else:
        spec = registry.get("device_backend", name)
        assert isinstance(spec, DeviceBackendSpec)
        if not spec.is_available():
            raise PluginError(
                f"device {name!r} is not available on this machine; available: "
                + ", ".join(s.name for s in registry.specs("device_backend") if s.is_available())
            )
    return spec.load()(**params)
