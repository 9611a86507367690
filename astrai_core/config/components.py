"""Checking a pluggable config section against the component it names.

A component class may define a nested pydantic ``Config`` model (``extra="forbid"``):
its section's keys are validated against it and errors name the field path
(``strategy.clip_eps``) and the config line. Without one, the keys are checked
against the class's ``__init__`` keyword arguments.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel

from astrai_core.config.loader import FieldPath, validate_model
from astrai_core.config.yaml_source import YamlSource
from astrai_core.errors import ConfigError, PluginError
from astrai_core.registry import Registry


def component_params(registry: Registry, kind: str, name: str, params: dict[str, Any],
                     field_path: FieldPath, source: YamlSource | None = None) -> dict[str, Any]:
    """Validate ``params`` for component ``kind``/``name``; returns the validated params.

    Raises ConfigError naming ``field_path`` for an unknown name or a bad option.
    """
    where = f"{source.where(field_path + ('name',))}: " if source is not None else ""
    label = ".".join(map(str, field_path))
    try:
        target = registry.get(kind, name).load()
    except PluginError as exc:
        raise ConfigError(f"{where}{label}.name: {exc}") from None
    config_model = getattr(target, "Config", None)
    if isinstance(config_model, type) and issubclass(config_model, BaseModel):
        validated = validate_model(config_model, params, source, field_path)
        return validated.model_dump()
    _check_keywords(target, params, f"{where}{label}")
    return dict(params)


def _check_keywords(target: Any, params: dict[str, Any], label: str) -> None:
    if not params or not callable(target):
        return
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if accepts_any:
        return
    unknown = sorted(set(params) - set(signature.parameters))
    if unknown:
        known = ", ".join(n for n in signature.parameters if n not in ("self",)) or "none"
        raise ConfigError(f"{label}: unknown option(s) {', '.join(unknown)}; options: {known}")
