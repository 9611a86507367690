"""Multimodal rotary positions (M-RoPE) of the Qwen-VL families through the transformers
backend.

A Qwen2-VL, Qwen2.5-VL or Qwen3-VL language model rotates each head's dimensions by three
positions at once (time, height, width): a text token has the same position in all three,
an image token its place in the image's grid of merged patches, offset by where the image
starts; the text after an image goes on from the largest position the image used, so a
row's positions end ``rope_delta`` away from its token count. The family computes these
[3, B, S] positions from the tokens and the images' grids (``get_rope_index``) when it is
given no positions; astrai gives it positions (left-padded prompts, the KV cache's
decoding), so the backend computes them here instead:

- a forward with images: the family's own ``get_rope_index`` over its tokens, each row's
  ``rope_delta`` kept in the KV cache;
- a decoding step of a row whose prompt had images: the row's next text position plus its
  ``rope_delta``, in all three sections;
- anything else (text only): the positions astrai gives, which the family repeats over the
  three sections itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def uses_mrope(decoder: nn.Module) -> bool:
    """Whether the base model places image tokens by M-RoPE (it has ``get_rope_index``)."""
    return callable(getattr(decoder, "get_rope_index", None))


def mrope_positions(decoder: nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                    images: Mapping[str, torch.Tensor] | None, kv_cache: Any
                    ) -> torch.Tensor | None:
    """The [3, B, S] positions of this forward's tokens; None to keep ``position_ids``
    (no image in the rows, nor in the prompts the KV cache holds)."""
    grids = None if not images else images.get("image_grid_thw")
    if grids is not None:
        seq = input_ids.shape[1]
        mask = None if attention_mask is None else attention_mask[:, -seq:]
        positions, deltas = decoder.get_rope_index(
            input_ids, mm_token_type_ids=images["mm_token_type_ids"], image_grid_thw=grids,
            attention_mask=mask)
        if kv_cache is not None:
            kv_cache.rope_deltas = deltas
        return positions
    deltas = getattr(kv_cache, "rope_deltas", None)
    if deltas is None:
        return None
    if position_ids is None:  # the cache's next columns, as the family counts them
        position_ids = torch.arange(kv_cache.length, kv_cache.length + input_ids.shape[1],
                                    device=input_ids.device)
    text = position_ids.expand(input_ids.shape[0], -1) + deltas.to(position_ids.device)
    return text.unsqueeze(0).expand(3, -1, -1)
