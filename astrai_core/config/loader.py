"""Loading a run config: YAML file + `--set` overrides → validated :class:`RunConfig`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from astrai_core.config.schema import RunConfig
from astrai_core.config.yaml_source import FieldPath, YamlSource
from astrai_core.errors import ConfigError


def parse_overrides(items: Sequence[str]) -> list[tuple[FieldPath, Any]]:
    """``["trainer.lr=1e-4", "rewards.0.weight=2"]`` → ``[(("trainer","lr"), 1e-4), ...]``.

    Values are read as YAML scalars (so ``true``, ``3``, ``[1, 2]`` get their types);
    numbers YAML 1.1 leaves as strings (``1e-4``) become floats.
    """
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE")
        path = tuple(int(part) if part.isdigit() else part for part in key.strip().split("."))
        parsed.append((path, _typed_value(raw)))
    return parsed


def _typed_value(raw: str) -> Any:
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[tuple[FieldPath, Any]]) -> None:
    """Set each override into the nested ``data`` in place, creating sections as needed."""
    for path, value in overrides:
        node: Any = data
        for depth, part in enumerate(path[:-1]):
            here = ".".join(map(str, path[: depth + 1]))
            if isinstance(node, list):
                if not isinstance(part, int) or part >= len(node):
                    raise ConfigError(f"--set {_dotted(path)}: {here} is not an item of the list")
                node = node[part]
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                raise ConfigError(f"--set {_dotted(path)}: {here} is not a section")
        last = path[-1]
        if isinstance(node, list) and isinstance(last, int) and last < len(node):
            node[last] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"--set {_dotted(path)}: cannot set this key")


@dataclass(frozen=True)
class ConfigFile:
    """A validated run config and the YAML it came from (for ``file:line`` in later errors)."""

    config: RunConfig
    source: YamlSource


def read_config(path: str | Path, overrides: Sequence[str] = ()) -> ConfigFile:
    """Read, override and validate a run config; any problem is one ConfigError."""
    source = YamlSource.from_file(path)
    if not isinstance(source.data, dict):
        raise ConfigError(f"{source.filename}: a config must be a mapping of sections")
    parsed = parse_overrides(overrides)
    apply_overrides(source.data, parsed)
    for field_path, _ in parsed:
        n = len(field_path)  # the file's lines under a replaced key no longer apply
        for stale in [key for key in source.lines if key[:n] == field_path]:
            del source.lines[stale]
        source.lines[field_path] = 0  # 0 marks "from --set", see _where
    return ConfigFile(validate_model(RunConfig, source.data, source, ()), source)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The validated :class:`RunConfig` of :func:`read_config`."""
    return read_config(path, overrides).config


def validate_model(model: type[BaseModel], data: Any, source: YamlSource | None,
                   prefix: FieldPath) -> Any:
    """``model.model_validate(data)`` with errors turned into one clear ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, prefix)) from None


def format_validation_error(exc: ValidationError, source: YamlSource | None,
                            prefix: FieldPath = ()) -> str:
    """``file:line: field.path: message``; several problems share the line, "; "-joined."""
    problems = []
    for error in exc.errors():
        field_path = prefix + tuple(part for part in error["loc"] if not _is_union_tag(part))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "missing":
            message = "field required"
        problems.append(field_message(source, field_path, message))
    return "; ".join(problems)


def field_message(source: YamlSource | None, field_path: FieldPath, message: str) -> str:
    """The one shape of every config error: ``file:line: dotted.path: message``."""
    return f"{_where(source, field_path)}{_dotted(field_path) or 'config'}: {message}"


def _where(source: YamlSource | None, field_path: FieldPath) -> str:
    """``file:line: ``, or the ``--set`` argument that gave the value at (or above) the
    field (line 0: there is no line of the file to point at)."""
    if source is None:
        return ""
    for end in range(len(field_path), 0, -1):  # the deepest key the file or --set gave
        line = source.lines.get(tuple(field_path[:end]))
        if line == 0:
            return "--set " if end == len(field_path) else f"--set {_dotted(field_path[:end])}: "
        if line is not None:
            break
    return source.where(field_path) + ": "


def _is_union_tag(part: Any) -> bool:
    # pydantic puts the union member's class name in the location; users never wrote it.
    return isinstance(part, str) and part[:1].isupper()


def _dotted(path: FieldPath) -> str:
    return ".".join(str(part) for part in path)
