"""Prompt records, the rollout runner's input: ``prompt_ids``, ``prompt_text``, ``columns``
and ``images``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptRecord:
    """One prompt: its token ids (chat template applied), its text, the row's other fields
    and a vision-language model's image inputs (the processor's output for this prompt
    alone, by name; None: no images)."""

    prompt_ids: list[int]
    prompt_text: str = ""
    columns: dict[str, Any] = field(default_factory=dict)
    images: dict[str, Any] | None = None


def as_prompt_record(record: Any) -> PromptRecord:
    """Accept a PromptRecord, any object with those attributes, or a mapping with those keys."""
    if isinstance(record, PromptRecord):
        return record
    get = record.get if isinstance(record, Mapping) else lambda key, default=None: getattr(record, key, default)
    prompt_ids = get("prompt_ids")
    if prompt_ids is None:
        raise ValueError(f"a prompt record needs prompt_ids; got {type(record).__name__}")
    return PromptRecord(prompt_ids=[int(t) for t in prompt_ids], prompt_text=get("prompt_text", "") or "",
                        columns=dict(get("columns", None) or {}), images=get("images", None) or None)
