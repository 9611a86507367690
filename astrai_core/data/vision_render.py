"""Chats with images through a vision-language model's processor: token ids with each
image expanded to its tokens, the assistant target mask, and the image tensors.

The chat is rendered as text chats are (:func:`~astrai_core.data.render.render_chat`,
each image part one placeholder, the family's image token); each placeholder is then
replaced by the tokens the processor makes for that image alone (never targets). The
result must be the processor's own tokens for the whole chat, which is checked: a
processor whose expansion depends on its neighbours is reported, not guessed.
Processed rows are cached with the text rows: the tensors in a safetensors file
(:class:`RowTensors`), nothing pickled.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from astrai_core.data import render
from astrai_core.data.image_batch import one_row

TENSORS_FILE = "images.safetensors"
_TEXT_INPUTS = ("input_ids", "attention_mask")


def processor_of(tokenizer: Any) -> Any:
    """The image processor bundle loaded with ``tokenizer`` (None: a text model)."""
    return getattr(tokenizer, "astrai_processor", None)


def processor_fingerprint(processor: Any) -> str:
    """A hash of the processor's config (image sizes, normalisation, tokens per image)."""
    return hashlib.sha256((type(processor).__name__ + processor.to_json_string()).encode()
                          ).hexdigest()


def placeholder_id(processor: Any) -> int:
    """The token a chat template writes for an image part, which the processor expands."""
    tokenizer = processor.tokenizer
    return int(tokenizer.convert_tokens_to_ids(processor.image_token))


def render_vision_chat(processor: Any, messages: list[dict], images: list[Any],
                       first_target: int = 0
                       ) -> tuple[list[int], list[int], dict[str, np.ndarray]]:
    """(token ids, target mask, image tensors) of a chat whose image parts are
    ``{"type": "image"}``, one per image of ``images`` in order; targets on the assistant
    turns from message ``first_target`` on (see :func:`render.render_chat`)."""
    tokenizer = processor.tokenizer
    ids, mask = render.render_chat(tokenizer, messages, first_target)
    marker = placeholder_id(processor)
    at = [i for i, token in enumerate(ids) if token == marker]
    if len(at) != len(images):
        raise ValueError(f"the chat template wrote {len(at)} image placeholder(s) for "
                         f"{len(images)} image part(s)")
    out_ids: list[int] = []
    out_mask: list[int] = []
    start = 0
    for position, image in zip(at, images):
        expansion = _call(processor, processor.image_token, [image])["input_ids"][0].tolist()
        out_ids += ids[start:position] + expansion
        out_mask += mask[start:position] + [0] * len(expansion)
        start = position + 1
    out_ids += ids[start:]
    out_mask += mask[start:]
    whole = _call(processor, render._template(tokenizer, messages, False), images)
    if whole["input_ids"][0].tolist() != out_ids:
        raise ValueError("the processor's tokens for an image depend on the text around "
                         "it, so the assistant's tokens cannot be placed")
    tensors = {name: np.ascontiguousarray(value[0] if one_row(name, value) else value)
               for name, value in whole.items() if name not in _TEXT_INPUTS}
    return out_ids, out_mask, tensors


def process_prompt(processor: Any, text: str, images: list[Any]
                   ) -> tuple[list[int], dict[str, np.ndarray]]:
    """(token ids, image inputs) of a rendered prompt whose placeholders stand for
    ``images``: the processor's output for it alone, as a sampler takes it."""
    out = _call(processor, text, images)
    return out["input_ids"][0].tolist(), {name: value for name, value in out.items()
                                          if name not in _TEXT_INPUTS}


def _call(processor: Any, text: str, images: list[Any]) -> Any:
    return processor(text=[text], images=[images], add_special_tokens=False, return_tensors="np")


class RowTensorsWriter:
    """Collects each row's image tensors, written as one safetensors file at close."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / TENSORS_FILE
        self.tensors: dict[str, np.ndarray] = {}
        self.rows = 0

    def append(self, tensors: dict[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            self.tensors[f"{self.rows}/{name}"] = value
        self.rows += 1

    def close(self) -> None:
        from safetensors.numpy import save_file

        if self.tensors:
            save_file(self.tensors, str(self.path))


class RowTensors:
    """The image tensors of a cache entry's rows, read row by row."""

    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        self.file = safe_open(str(path), framework="numpy")
        self.names: dict[int, list[str]] = {}
        for key in self.file.keys():
            row, _, name = key.partition("/")
            self.names.setdefault(int(row), []).append(name)

    def of(self, row: int) -> dict[str, np.ndarray]:
        """Row ``row``'s tensors by name (empty for a row without images)."""
        return {name: self.file.get_tensor(f"{row}/{name}") for name in self.names.get(row, [])}


class FieldTensors:
    """One field's image tensors of a preference or unpaired source: the prompt's images,
    which every response shares (stored once), and the field's own per-token tensors
    (stored as ``<field>/<name>``, as long as that response's tokens)."""

    def __init__(self, tensors: RowTensors, field: str) -> None:
        self.tensors, self.field = tensors, field
        self.names = tensors.names

    def of(self, row: int) -> dict[str, np.ndarray]:
        out = {}
        for name, value in self.tensors.of(row).items():
            owner, _, own = name.rpartition("/")
            if not owner or owner == self.field:
                out[own] = value
        return out


def field_tensors(tensors: RowTensors | None, field: str) -> FieldTensors | None:
    """``field``'s view of a source's image tensors (None: the source has none)."""
    return None if tensors is None else FieldTensors(tensors, field)
