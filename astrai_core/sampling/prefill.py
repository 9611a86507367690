"""Long prompts in the torch sampler: chunked prefill and batches with bounded padding.

A prompt's prefill runs in chunks of ``chunk`` tokens, each attending to the KV cache
filled so far, so its activations (and the attention mask of a padded batch) are those
of ``chunk`` queries, not of the whole prompt. Only the last chunk's last position
needs logits.

A decode batch's rows are left-padded to its longest, so the batch's KV cache holds
rows x longest positions per layer. Rows share a batch only while that stays within
:data:`PADDING_BOUND` times their real positions (:func:`fits`), or while every row is
short (:data:`SHORT_PROMPT`): one 32k-token prompt among short ones decodes in its own
batch instead of widening every short row to 32k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

PREFILL_CHUNK = 2048  # prompt tokens per prefill forward
PADDING_BOUND = 2     # a batch's cache positions at most this many times its real ones
SHORT_PROMPT = 512    # ... unless its rows are all this short: their padding costs little


def fits(rows: int, width: int, real: int) -> bool:
    """Whether ``rows`` rows left-padded to ``width`` columns, ``real`` of their positions
    real tokens, may share a batch (see the module docstring)."""
    return width <= SHORT_PROMPT or rows * width <= PADDING_BOUND * real


def padded_batches(lengths: Sequence[int], max_rows: int) -> list[range]:
    """``lengths`` (ascending) cut into consecutive batches of at most ``max_rows`` rows
    that each :func:`fits`."""
    batches, start, real = [], 0, 0
    for index, length in enumerate(lengths):
        rows = index - start + 1
        if rows > max_rows or not fits(rows, length, real + length):
            batches.append(range(start, index))
            start, real = index, 0
        real += length
    if lengths:
        batches.append(range(start, len(lengths)))
    return batches


def new_cache(model: torch.nn.Module, batch_size: int, max_length: int, device: torch.device):
    """An empty KV cache for ``model``: the native one, or the one a backend brings
    (``model.new_kv_cache``, model_backends/)."""
    from astrai_core.model.kv_cache import KVCache

    dtype = next(model.parameters()).dtype
    make = getattr(model, "new_kv_cache", None)
    if make is not None:
        return make(batch_size, max_length, dtype=dtype, device=device)
    return KVCache(model.config, batch_size, max_length, dtype=dtype, device=device)


def chunked_prefill(model: torch.nn.Module, input_ids: Tensor, cache, *,
                    attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                    chunk: int = PREFILL_CHUNK, extra: dict | None = None,
                    after_chunk: Callable[[int], None] | None = None) -> Tensor:
    """Fill ``cache`` with ``input_ids`` [B, S], ``chunk`` tokens per forward; the logits
    [B, V] of the next token after the last position.

    ``attention_mask`` [B, S] (1 = real) for left-padded rows, ``position_ids`` [B, S];
    ``extra``: more forward arguments (``logits_to_keep``); ``after_chunk(tokens)`` runs
    after each forward (the routing record of an MoE model). A prompt of at most
    ``chunk`` tokens is one forward, exactly the unchunked call.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    length = input_ids.shape[1]
    logits = None
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        out = model(input_ids[:, start:end],
                    attention_mask=None if attention_mask is None else attention_mask[:, :end],
                    position_ids=None if position_ids is None else position_ids[:, start:end],
                    kv_cache=cache, **(extra or {}))
        logits = out["logits"][:, -1]
        if after_chunk is not None:
            after_chunk(end - start)
    return logits
