"""Rows with images, through a vision-language model's processor: chats, preference and
unpaired rows whose prompt holds the images, and prompts (for generation).

A preference pair's chosen and rejected responses (an unpaired row's completion) follow
the same prompt, so they share its images: the image tensors are stored once per row,
and only the per-token ones (as long as each response's tokens, e.g. Gemma 3's
``token_type_ids``) once per response, as ``<field>/<name>``
(:class:`~astrai_core.data.vision_render.FieldTensors` reads them back).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from astrai_core.data import render
from astrai_core.data.image_batch import PER_TOKEN
from astrai_core.data.images import (PartsError, holds_image_parts, open_row_images,
                                     split_images)
from astrai_core.data.vision_render import process_prompt, processor_of, render_vision_chat
from astrai_core.errors import DataError

Tensors = dict[str, np.ndarray]


def vision_chat(tokenizer: Any, row: dict, path: Path, line_number: int
                ) -> tuple[list[int], list[int], Tensors]:
    """A chat with images: its tokens, targets and image tensors."""
    where = f"data file {path}, line {line_number}"
    processor = _processor(tokenizer, where)
    messages, images = _opened(row["messages"], row, path, where)
    return _render(processor, messages, images, where)


def vision_responses(tokenizer: Any, row: dict, keys: tuple[str, ...], path: Path,
                     line_number: int
                     ) -> tuple[dict[str, tuple[list[int], list[int]]], Tensors]:
    """``({key: (ids, mask)}, tensors)`` of a preference or unpaired row whose prompt
    holds images: each response rendered after the prompt (mask 1 on its tokens), and
    the row's image tensors (see the module docstring)."""
    where = f"data file {path}, line {line_number}"
    processor = _processor(tokenizer, where)
    _require_messages(row, where)
    for key in keys:
        if holds_image_parts(row[key]):
            raise DataError(f"{where}: field {key!r} holds an image; images go in the prompt, "
                            "which every response shares")
    prefix, images = _opened(row["messages"], row, path, where)
    encoded: dict[str, tuple[list[int], list[int]]] = {}
    tensors: Tensors = {}
    for key in keys:
        value = row[key]
        response = [{"role": "assistant", "content": value}] if isinstance(value, str) else value
        ids, mask, own = _render(processor, prefix + response, images, where, len(prefix))
        encoded[key] = (ids, mask)
        for name, array in own.items():
            tensors[f"{key}/{name}" if name in PER_TOKEN else name] = array
    return encoded, tensors


def prompt_has_images(row: dict) -> bool:
    """Whether a validated prompt row holds image parts or an ``images`` column."""
    return holds_image_parts(row["messages"] or []) or bool(row["columns"].get("images"))


def vision_prompt(tokenizer: Any, row: dict, tools: list[dict] | None, path: Path,
                  line_number: int) -> tuple[str, list[int], Tensors, dict]:
    """(prompt text, token ids, image inputs, other columns) of a prompt row with images:
    rendered with the chat template and its generation prompt, each image expanded into
    its tokens, and the image inputs as the processor gives them for this prompt alone
    (what a sampler takes). Images of the ``images`` column that no image part takes go
    before the text of the first user turn (a string prompt is one user turn); the
    column itself is not passed on (rewards see the other columns)."""
    where = f"data file {path}, line {line_number}"
    processor = _processor(tokenizer, where)
    columns = dict(row["columns"])
    listed = columns.pop("images", None)
    if listed is not None and not isinstance(listed, list):
        raise DataError(f"{where}: field 'images' must be a list of images")
    messages = row["messages"] or [{"role": "user", "content": row["prompt"]}]
    if listed and not holds_image_parts(messages):
        messages = _images_first(messages, len(listed))
    messages, images = _opened(messages, {"images": listed}, path, where)
    text = render._template(tokenizer, messages, generation_prompt=True, tools=tools)
    try:
        ids, tensors = process_prompt(processor, text, images)
    except ValueError as err:
        raise DataError(f"{where}: the model's processor refused the images: {err}") from None
    return text, ids, tensors, columns


def _images_first(messages: list[dict], count: int) -> list[dict]:
    """``messages`` with ``count`` image parts before the first user turn's text."""
    at = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    content = messages[at]["content"]
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    parts = [{"type": "image"} for _ in range(count)] + text
    return [*messages[:at], {**messages[at], "content": parts}, *messages[at + 1:]]


def _require_messages(row: dict, where: str) -> None:
    if row["messages"] is None:
        raise DataError(f"{where}: the row's 'images' need image parts in a prompt given as "
                        "messages (a string prompt holds no images)")


def _processor(tokenizer: Any, where: str) -> Any:
    processor = processor_of(tokenizer)
    if processor is None:
        raise DataError(f"{where}: the row holds images, and the model has no image "
                        "processor (a vision-language model's directory has one)")
    return processor


def _opened(messages: list[dict], row: dict, path: Path, where: str
            ) -> tuple[list[dict], list[Any]]:
    """(the messages with plain image parts, their images opened)."""
    try:
        plain, sources = split_images(messages, row.get("images"))
    except PartsError as err:
        raise DataError(f"{where}: {err}") from None
    return plain, open_row_images(sources, path.parent, where)


def _render(processor: Any, messages: list[dict], images: list[Any], where: str,
            first_target: int = 0) -> tuple[list[int], list[int], Tensors]:
    try:
        return render_vision_chat(processor, messages, images, first_target)
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None
