"""Image tensors in a training batch, one row per example.

A document of a row with images carries them as ``image/<name>`` arrays (per image, or
per token for ``token_type_ids``). A batch keeps every tensor row-aligned, so that cutting
it into ranks' shares or micro-batches by rows keeps each row's images with it:
``image/<name>`` is [B, most images of a row, ...] zero-padded, with ``image/<name>.rows``
[B] the row's own count; per-token tensors are [B, S] like ``input_ids``.
:func:`batch_images` turns these back into what the model's processor would have given
for the batch, the ``images`` a transformers-backend model's forward takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

PREFIX = "image/"
ROWS = ".rows"
PER_TOKEN = ("token_type_ids", "mm_token_type_ids")
# Families whose image inputs are [B, images, ...] (a row's images together, zero images
# as padding), not every image of the batch end to end.
BATCH_FIRST = ("idefics2", "idefics3", "smolvlm")


def has_images(rows: list[list[dict[str, np.ndarray]]]) -> bool:
    return any(key.startswith(PREFIX) for row in rows for doc in row for key in doc)


def collate_images(rows: list[list[dict[str, np.ndarray]]], width: int, left: bool = False
                   ) -> dict[str, torch.Tensor]:
    """The ``image/`` tensors of a batch of one-document rows (see the module docstring);
    ``left``: per-token tensors are left-padded, as a sampler's prompts are."""
    names = sorted({key for row in rows for doc in row for key in doc if key.startswith(PREFIX)})
    out: dict[str, torch.Tensor] = {}
    for key in names:
        values = [row[0].get(key) for row in rows]
        if key.removeprefix(PREFIX) in PER_TOKEN:
            padded = np.zeros((len(rows), width), dtype=np.int64)
            for b, value in enumerate(values):
                if value is not None:
                    start = width - len(value) if left else 0
                    padded[b, start:start + len(value)] = value
            out[key] = torch.from_numpy(padded)
            continue
        sample = next(v for v in values if v is not None)
        counts = [0 if v is None else len(v) for v in values]
        padded = np.zeros((len(rows), max(counts), *sample.shape[1:]), dtype=sample.dtype)
        for b, value in enumerate(values):
            if value is not None:
                padded[b, :len(value)] = value
        out[key] = torch.from_numpy(padded)
        out[key + ROWS] = torch.tensor(counts, dtype=torch.long)
    return out


def has_image_inputs(batch: dict[str, torch.Tensor]) -> bool:
    """Whether a collated batch carries image tensors."""
    return any(key.startswith(PREFIX) for key in batch)


def batch_images(batch: dict[str, torch.Tensor], model_type: str
                 ) -> dict[str, torch.Tensor] | None:
    """The batch's image tensors as ``model_type``'s forward takes them (the processor's
    names and shapes); None for a batch without images (its per-token image types are
    then all 0, text: nothing to pass)."""
    images = {key: value for key, value in batch.items() if key.startswith(PREFIX)}
    if not any(int(value.sum()) for key, value in images.items() if key.endswith(ROWS)):
        return None  # a rank's share or a micro-batch of text rows only: no pixels to run
    out = {}
    for key, value in images.items():
        if key.endswith(ROWS):
            continue
        name = key.removeprefix(PREFIX)
        counts = images.get(key + ROWS)
        if counts is None or model_type in BATCH_FIRST:
            out[name] = value
        else:  # every image of the batch end to end, row by row
            out[name] = torch.cat([value[b, :int(n)] for b, n in enumerate(counts.tolist())])
    return out


def prompt_images(images: list[dict[str, Any] | None], width: int, model_type: str,
                  device: torch.device) -> dict[str, torch.Tensor]:
    """The image inputs of a sampler's batch of left-padded prompts (``width`` columns),
    from each prompt's processor output for it alone (tensors or arrays, ``[1, ...]``
    per token and for Idefics3's images, as the processor returns them)."""
    out = batch_images(collate_prompt_images(images, width), model_type) or {}
    return {name: value.to(device) for name, value in out.items()}


def collate_prompt_images(images: list[dict[str, Any] | None], width: int
                          ) -> dict[str, torch.Tensor]:
    """The row-aligned ``image/`` tensors (see the module docstring) of a batch of
    prompts left-padded to ``width`` columns, from each prompt's processor output."""
    rows = []
    for tensors in images:
        doc = {}
        for name, value in (tensors or {}).items():
            array = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value)
            doc[PREFIX + name] = array[0] if one_row(name, array) else array
        rows.append([doc])
    return collate_images(rows, width, left=True)


def one_row(name: str, value: np.ndarray) -> bool:
    """Whether the processor gave ``name`` for one row as [1, ...] (per token, or
    Idefics3's [1, images, ...]), an axis a batch row does not keep."""
    return name in PER_TOKEN or name == "pixel_attention_mask" or (
        name == "pixel_values" and value.ndim == 5)
