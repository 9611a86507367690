"""Attention masks for scaled_dot_product_attention, built once per forward.

The mask combines: causal order, padding (``attention_mask`` [B, total_len], 1 = real
token), packed documents (a position id that does not follow its predecessor by exactly
1 starts a new document; tokens attend only within their document) and an optional
sliding window. Every query may always attend to its own position, so fully masked
rows (left-padding queries) give finite outputs instead of NaN; those outputs are
ignored anyway.

Packed rows (several documents in a row, no KV cache) get no mask: their attention is
computed per document (``model/document_attention.py``), at the cost of the documents'
squares instead of the row's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from astrai_core.model.context_parallel import ContextShard
from astrai_core.model.document_attention import DocumentLayout, document_layout


@dataclass
class AttentionBias:
    """What SDPA needs: an additive mask [B, 1, S, total_len] or None, and is_causal; or,
    for packed rows, the documents' layout (attention per document) and the sliding window."""

    mask: torch.Tensor | None
    is_causal: bool
    documents: DocumentLayout | None = None
    window: int | None = None
    # context parallel: the bias is the whole rows'; attention trades this rank's token
    # shard for a head shard first (model/context_parallel.py)
    context: ContextShard | None = None


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, S] index of the packed document each token belongs to (0 for the first)."""
    first = position_ids[:, :1] - 1
    steps = torch.diff(position_ids, prepend=first, dim=-1)
    return (steps != 1).cumsum(-1)


def build_attention_bias(
    *,
    query_len: int,
    past_len: int,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    sliding_window: int | None,
    dtype: torch.dtype,
    device: torch.device,
) -> AttentionBias:
    """Mask for queries at [past_len, past_len + query_len) over keys [0, past_len + query_len).

    ``position_ids`` are given only when packed documents should be detected (no KV cache).
    """
    total_len = past_len + query_len
    if attention_mask is not None and attention_mask.shape[-1] != total_len:
        raise ValueError(f"attention_mask has {attention_mask.shape[-1]} columns, expected {total_len} "
                         f"(cache length {past_len} + {query_len} new tokens)")
    padded = attention_mask is not None and not bool(attention_mask.all())
    documents = None
    if position_ids is not None:
        documents = document_ids(position_ids)
        if not bool(documents[:, -1].any()):
            documents = None  # one document per row: plain causal
    window = sliding_window if sliding_window is not None and sliding_window < total_len else None

    if documents is not None and past_len == 0 and _several_documents(
            documents, attention_mask if padded else None):
        layout = document_layout(documents, attention_mask if padded else None)
        if layout is not None:
            return AttentionBias(None, is_causal=True, documents=layout, window=window)
    if documents is None and window is None and query_len == 1 and past_len > 0:
        return _single_query_bias(attention_mask if padded else None, dtype)
    if not padded and documents is None and window is None and past_len == 0:
        return AttentionBias(None, is_causal=True)

    query_pos = torch.arange(past_len, total_len, device=device)[:, None]
    key_pos = torch.arange(total_len, device=device)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed = allowed & (key_pos > query_pos - window)
    allowed = allowed[None, None]  # [1, 1, S, total]
    if padded:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    if documents is not None:
        allowed = allowed & (documents[:, None, :, None] == documents[:, None, None, :])
    allowed = allowed | (key_pos == query_pos)[None, None]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return AttentionBias(bias, is_causal=False)


def packed_layout(attention_mask: torch.Tensor | None, position_ids: torch.Tensor
                  ) -> DocumentLayout | None:
    """The per-document layout of rows ([B, S] positions, no KV cache) when some row packs
    several documents, as :func:`build_attention_bias` finds it; None otherwise (one
    document per row, or padding inside a document)."""
    documents = document_ids(position_ids)
    if not bool(documents[:, -1].any()):
        return None
    padded = attention_mask if attention_mask is not None and not bool(attention_mask.all()) \
        else None
    if not _several_documents(documents, padded):
        return None
    return document_layout(documents, padded)


def given_layout_bias(layout: DocumentLayout, sliding_window: int | None,
                      seq: int) -> AttentionBias:
    """The bias of a packed row whose segments the caller gave (shared prompts)."""
    if layout.spans and layout.spans[-1][1] != seq:
        raise ValueError(f"the document layout covers {layout.spans[-1][1]} tokens, the "
                         f"input has {seq}")
    window = sliding_window if sliding_window is not None and sliding_window < seq else None
    return AttentionBias(None, is_causal=True, documents=layout, window=window)


def _several_documents(documents: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether some row packs more than one document among its real tokens. A padded row of
    one document keeps the padded path's mask (the numbers of unpacked batches stay as
    they were); only packed rows are computed per document."""
    if attention_mask is None:
        return True  # documents were found, and nothing is padding
    real = attention_mask.bool()
    last = documents.masked_fill(~real, -1).amax(-1)
    first = documents.masked_fill(~real, documents.shape[-1] + 1).amin(-1)
    return bool((last > first).any())


def _single_query_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> AttentionBias:
    """One new token (a decode step) sees every real cached token and itself: padding only.

    The same mask as the general path, in a few operations, because it runs every step.
    """
    if attention_mask is None:
        return AttentionBias(None, is_causal=False)  # one new token sees the whole cache
    blocked = attention_mask[:, None, None, :] == 0
    blocked[..., -1] = False  # its own position, always
    bias = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
    bias.masked_fill_(blocked, torch.finfo(dtype).min)
    return AttentionBias(bias, is_causal=False)


def positions_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, L] that count real tokens only (padding gets 0), as HF generate does.

    With left-padded prompts, pass these (their last S columns) as ``position_ids`` so
    each sequence's positions start at 0 at its first real token.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
