"""The running decode batch of continuous batching, shared by the server's engine and the
torch sampler: rows join (a prefill merged into the KV cache) and leave (finished) between
decode steps, so a batch's work follows its active rows, not its longest one.

The KV cache is left-padded: all rows share the cache length, and each row's real tokens
end at the last column. Rows joining with a longer prompt than the cache shift the others
right; columns no row needs any more are trimmed on the left. Each row keeps its own
sampling state (:class:`~astrai_core.sampling.rows.RowSampling`) and positions, so a
seeded row samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from astrai_core.model.kv_cache import KVCache
from astrai_core.sampling.prefill import PREFILL_CHUNK, chunked_prefill
from astrai_core.sampling.rows import RowSampling

GROWTH = 64  # cache columns added at a time


class RunningBatch:
    """The running decode batch: rows (any objects: the caller's requests), their KV cache,
    attention mask [B, capacity] (1 = real), positions [B, 1], next inputs [B], sampling."""

    def __init__(self, rows: list[Any], cache: KVCache, mask: Tensor, positions: Tensor,
                 tokens: Tensor, sampling: RowSampling) -> None:
        self.rows, self.cache, self.mask = rows, cache, mask
        self.positions, self.tokens, self.sampling = positions, tokens, sampling

    def keep(self, keep: list[int]) -> None:
        """Keep these rows, and trim the cache columns no remaining row uses."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        length = self.cache.length
        mask = self.mask.index_select(0, index)
        first = int(mask[:, :length].argmax(dim=1).min()) if length else 0  # the earliest real column
        for tensors in (self.cache.keys, self.cache.values):  # layer by layer: one cache at a time
            for layer, tensor in enumerate(tensors):
                tensors[layer] = tensor.index_select(0, index)[:, :, first:]
        self.cache.length -= first
        self.cache.max_length -= first
        self.mask = mask[:, first:]
        self.positions, self.tokens = self.positions.index_select(0, index), self.tokens.index_select(0, index)
        self.rows = [self.rows[i] for i in keep]
        self.sampling.select(keep)

    def ensure_capacity(self, needed: int) -> None:
        if needed <= self.cache.max_length:
            return
        grow = max(GROWTH, needed - self.cache.max_length)
        self.cache.grow(grow)
        self.mask = torch.nn.functional.pad(self.mask, (0, grow))

    def extend(self, other: RunningBatch) -> None:
        """Append ``other``'s rows, right-aligning both caches at the longer length."""
        length = max(self.cache.length, other.cache.length)
        capacity = length + GROWTH
        for mine, theirs in ((self.cache.keys, other.cache.keys),
                             (self.cache.values, other.cache.values)):
            for layer, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                mine[layer] = _aligned(a, b, self.cache.length, other.cache.length, length, capacity)
        mask = torch.zeros(len(self.rows) + len(other.rows), capacity, dtype=torch.long,
                           device=self.mask.device)
        mask[:len(self.rows), length - self.cache.length:length] = self.mask[:, :self.cache.length]
        mask[len(self.rows):, length - other.cache.length:length] = other.mask[:, :other.cache.length]
        self.mask = mask
        self.cache.length, self.cache.max_length = length, capacity
        self.positions = torch.cat([self.positions, other.positions])
        self.tokens = torch.cat([self.tokens, other.tokens])
        self.rows += other.rows
        self.sampling.extend(other.sampling)


def _aligned(a: Tensor, b: Tensor, a_len: int, b_len: int, length: int, capacity: int) -> Tensor:
    """[Ba + Bb, H, capacity, D] with a's and b's filled columns ending at ``length``."""
    out = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], capacity, a.shape[3])
    out[:a.shape[0], :, length - a_len:length] = a[:, :, :a_len]
    out[a.shape[0]:, :, length - b_len:length] = b[:, :, :b_len]
    return out


def prefill(model: torch.nn.Module, rows: list[Any], prompts: list[list[int]],
            sampling: RowSampling, chunk: int = PREFILL_CHUNK) -> tuple[RunningBatch, Tensor]:
    """A new batch of ``rows`` whose ``prompts`` all have the same length, and the logits
    [B, V] of each row's first token. Rows with the same prompt share one prefill row (the
    n completions of a prompt), its KV cache copied to each of them. A prompt longer than
    ``chunk`` tokens is prefilled ``chunk`` tokens per forward."""
    device = sampling.device
    length = len(prompts[0])
    index: dict[tuple[int, ...], int] = {}
    copies = [index.setdefault(tuple(p), len(index)) for p in prompts]
    ids = torch.tensor([list(p) for p in index], dtype=torch.long, device=device)
    weight = next(model.parameters())
    cache = KVCache(model.config, len(index), length, dtype=weight.dtype, device=device)
    logits = chunked_prefill(model, ids, cache, chunk=chunk, extra=last_logits_only(model))
    if len(index) < len(rows):
        copy = torch.tensor(copies, dtype=torch.long, device=device)
        cache.select(copy)
        logits = logits.index_select(0, copy)
    mask = torch.ones(len(rows), length, dtype=torch.long, device=device)
    positions = torch.full((len(rows), 1), length, dtype=torch.long, device=device)
    tokens = torch.zeros(len(rows), dtype=torch.long, device=device)
    return RunningBatch(list(rows), cache, mask, positions, tokens, sampling), logits


def decode(model: torch.nn.Module, batch: RunningBatch) -> Tensor:
    """One decode forward of every row's ``tokens``: the logits [B, V] of their next tokens."""
    length = batch.cache.length
    batch.ensure_capacity(length + 1)
    batch.mask[:, length] = 1
    step_mask = batch.mask[:, :length + 1]
    padded = not bool(step_mask.all())
    logits = model(batch.tokens[:, None], attention_mask=step_mask if padded else None,
                   position_ids=batch.positions, kv_cache=batch.cache)["logits"][:, -1]
    batch.positions = batch.positions + 1
    return logits


def last_logits_only(model: torch.nn.Module) -> dict[str, int]:
    """Prefill needs only the last position's logits: ask for just those when the model can."""
    parameters = inspect.signature(model.forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
