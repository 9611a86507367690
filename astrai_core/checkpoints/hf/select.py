"""Choosing a model importer: by name, or by the ``model_type`` a checkpoint declares.

``astrai import`` reads ``model_type`` from the HF ``config.json``; ``astrai export``
reads the one the import recorded in the native checkpoint's ``hf_source.json``, and
for a model trained from scratch derives it from the architecture
(:func:`default_model_type`). ``--importer NAME`` overrides both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astrai_core.checkpoints.hf.files import read_hf_config
from astrai_core.checkpoints.hf.source import (
    default_model_type,
    read_hf_source,
    unsupported_model_type_message,
)
from astrai_core.errors import CheckpointError, PluginError
from astrai_core.plugins.registry import Registry
from astrai_core.plugins.specs import ModelImporterSpec

KIND = "model_importer"


def importer_spec_for(registry: Registry, model_type: str) -> ModelImporterSpec:
    """The one importer whose spec lists ``model_type``."""
    specs = [s for s in registry.specs(KIND) if model_type in getattr(s, "model_types", ())]
    if len(specs) > 1:
        names = ", ".join(s.name for s in specs)
        raise PluginError(f"several importers handle model_type {model_type!r} ({names}); "
                          "choose one with --importer NAME")
    if not specs:
        supported = sorted({t for s in registry.specs(KIND) for t in getattr(s, "model_types", ())})
        raise CheckpointError(unsupported_model_type_message(
            model_type, f"supported: {', '.join(supported) or 'none'}"))
    return specs[0]  # type: ignore[return-value]


def load_importer(registry: Registry, *, name: str | None = None,
                  model_type: str | None = None) -> Any:
    """An instance of the importer called ``name``, else of the one for ``model_type``."""
    if name is not None:
        spec = registry.get(KIND, name)
    elif model_type is not None:
        spec = importer_spec_for(registry, model_type)
    else:
        raise PluginError("no importer name and no model_type to choose an importer by")
    return spec.load()()


def importer_for_hf_dir(registry: Registry, src_dir: Path, name: str | None = None) -> Any:
    """The importer for an HF checkpoint directory (``--importer`` wins over its model_type)."""
    if name is not None:
        return load_importer(registry, name=name)
    model_type = read_hf_config(src_dir).get("model_type")
    if not isinstance(model_type, str):
        raise CheckpointError(f"{src_dir / 'config.json'} has no 'model_type'; pass --importer NAME")
    return load_importer(registry, model_type=model_type)


def export_model_type(native_dir: Path) -> str:
    """The HF model_type to export a native checkpoint as."""
    from astrai_core.checkpoints.native_files import load_config

    recorded = read_hf_source(native_dir).get("model_type")
    return recorded if isinstance(recorded, str) else default_model_type(load_config(native_dir))
