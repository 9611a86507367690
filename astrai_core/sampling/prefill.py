"""Long prompts in the torch sampler: chunked prefill and batches bucketed by prompt length.

A prompt's prefill runs in chunks of ``chunk`` tokens, each attending to the KV cache
filled so far, so its activations (and the attention mask of a padded batch) are those
of ``chunk`` queries, not of the whole prompt. Only the last chunk's last position
needs logits.

Prompts share a decode batch only with prompts of the same length bucket
(:func:`length_bucket`): all prompts up to :data:`SHORT_PROMPT` tokens, then buckets
that double in length. A batch's rows are left-padded to its longest prompt, so within
a bucket (past the first) the padding is less than the rows' own tokens, and one 32k
prompt never widens the cache rows of short prompts to 32k.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

PREFILL_CHUNK = 2048  # prompt tokens per prefill forward
SHORT_PROMPT = 512    # prompts up to this many tokens share one bucket


def length_bucket(length: int) -> int:
    """0 for prompts up to SHORT_PROMPT tokens, then k for (SHORT_PROMPT·2^(k-1), SHORT_PROMPT·2^k]."""
    if length <= SHORT_PROMPT:
        return 0
    return (-(-length // SHORT_PROMPT) - 1).bit_length()


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
