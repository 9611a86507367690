"""Long prompts in the torch sampler: chunked prefill and batches with bounded padding.

A prompt's prefill runs in chunks of ``chunk`` tokens, each attending to the KV cache
filled so far, so its activations (and the attention mask of a padded batch) are those
of ``chunk`` queries, not of the whole prompt. Only the last chunk's last position
needs logits.

A batch's prefill need not pay for its padding, though: rows whose lengths differ
(a partial rollout's carried sequences, each its prompt plus the tokens it has so far)
are prefilled in runs of similar lengths (:func:`ragged_prefill`), each run's keys and
values then right-aligned in the batch's left-padded cache.

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
PREFILL_PADDING = 1.25  # a prefill forward's positions at most this many times its tokens


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


def mostly_padding(attention_mask: Tensor) -> bool:
    """Whether left-padded rows [B, S] (1 = real) hold more than :data:`PADDING_BOUND`
    times as many positions as tokens: then :func:`ragged_prefill` is worth its forwards."""
    return attention_mask.numel() > PADDING_BOUND * int(attention_mask.sum())


def prefill_runs(lengths: Sequence[int]) -> list[list[int]]:
    """The rows (indices into ``lengths``) of each prefill forward: runs of rows in order of
    length whose positions, padded to the run's longest, stay within
    :data:`PREFILL_PADDING` times their tokens."""
    order = sorted(range(len(lengths)), key=lambda row: lengths[row])
    runs: list[list[int]] = []
    real = 0
    for row in order:
        length = lengths[row]
        if runs and (len(runs[-1]) + 1) * length <= PREFILL_PADDING * (real + length):
            runs[-1].append(row)
            real += length
        else:
            runs.append([row])
            real = length
    return runs


def ragged_prefill(model: torch.nn.Module, input_ids: Tensor, cache, *, attention_mask: Tensor,
                   position_ids: Tensor, chunk: int = PREFILL_CHUNK,
                   extra: dict | None = None) -> Tensor:
    """:func:`chunked_prefill` of left-padded rows [B, S] into a native ``cache``, one
    forward per run of similar lengths (:func:`prefill_runs`) into a cache of its own
    width, whose keys and values are then copied into ``cache`` right-aligned at S (the
    batch's padding columns stay zero: the mask hides them). The logits [B, V] of every
    row's next token, in the rows' order."""
    from astrai_core.model.kv_cache import KVCache

    width = input_ids.shape[1]
    lengths = attention_mask.sum(dim=1).tolist()
    logits = None
    for rows in prefill_runs(lengths):
        run = max(lengths[row] for row in rows)
        index = torch.tensor(rows, dtype=torch.long, device=input_ids.device)
        mask = attention_mask[index, width - run:]
        part = KVCache(model.config, len(rows), run, dtype=cache.keys[0].dtype,
                       device=cache.keys[0].device)
        out = chunked_prefill(model, input_ids[index, width - run:], part,
                              attention_mask=None if bool(mask.all()) else mask,
                              position_ids=position_ids[index, width - run:], chunk=chunk,
                              extra=extra)
        for whole, piece in ((cache.keys, part.keys), (cache.values, part.values)):
            for layer, tensor in enumerate(piece):
                whole[layer][index, :, width - run:width] = tensor
        logits = out.new_empty(len(lengths), out.shape[1]) if logits is None else logits
        logits[index] = out
    cache.advance(width)
    return logits
