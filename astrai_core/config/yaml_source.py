"""YAML reading that remembers the line of every key, so errors can point at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from astrai_core.errors import ConfigError

FieldPath = tuple[Any, ...]


class YamlSource:
    """A parsed YAML document plus the source line of every mapping key / list item."""

    def __init__(self, data: Any, lines: dict[FieldPath, int], filename: str) -> None:
        self.data = data
        self.lines = lines
        self.filename = filename

    @classmethod
    def from_file(cls, path: str | Path) -> YamlSource:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        text = path.read_text(encoding="utf-8")
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{where}: invalid YAML: {problem}") from None
        lines: dict[FieldPath, int] = {}
        if node is not None:
            _record_lines(node, (), lines)
        return cls(data if data is not None else {}, lines, str(path))

    def where(self, field_path: FieldPath) -> str:
        """``file:line`` of the deepest recorded key on ``field_path``."""
        for end in range(len(field_path), 0, -1):
            line = self.lines.get(tuple(field_path[:end]))
            if line is not None:
                return f"{self.filename}:{line}"
        return self.filename


def _record_lines(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = path + (key_node.value,)
            lines[key_path] = key_node.start_mark.line + 1
            _record_lines(value_node, key_path, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            item_path = path + (index,)
            lines[item_path] = item.start_mark.line + 1
            _record_lines(item, item_path, lines)
