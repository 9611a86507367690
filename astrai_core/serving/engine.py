"""Continuous batching with the live native model: one decode batch shared by every client.

A background thread runs the loop. At each step boundary it drops cancelled sequences
(a disconnected client frees its slot before the next forward), admits waiting requests
(prefilled in groups of equal prompt length, then merged into the running batch's KV
cache), and runs one decode forward for every active sequence. Sequences leave the
batch as soon as they finish.

The running KV cache is left-padded: all rows share the cache length, and each row's
real tokens end at the last column. A request joining with a longer prompt than the
cache shifts the others right; columns no row needs any more are trimmed on the left.
Sampling is :class:`~astrai_core.sampling.rows.RowSampling`, the torch sampler's own,
with the same per-request random streams, so a seeded request samples the same tokens
here and in ``TorchSampler.generate``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from astrai_core.model.kv_cache import KVCache
from astrai_core.sampling.rows import RowSampling
from astrai_core.serving.engine_base import ThreadedEngine
from astrai_core.serving.sequence import Sequence

_GROWTH = 64  # cache columns added at a time


class _Batch:
    """The running decode batch: rows, their KV cache, attention mask, positions, next inputs."""

    def __init__(self, rows: list[Sequence], cache: KVCache, mask: Tensor, positions: Tensor,
                 tokens: Tensor, sampling: RowSampling) -> None:
        self.rows, self.cache, self.mask = rows, cache, mask   # mask [B, capacity], 1 = real
        self.positions, self.tokens, self.sampling = positions, tokens, sampling  # [B, 1], [B]

    def keep(self, keep: list[int]) -> None:
        """Keep these rows, and trim the cache columns no remaining row uses."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        length = self.cache.length
        mask = self.mask.index_select(0, index)
        first = int(mask[:, :length].argmax(dim=1).min()) if length else 0  # the earliest real column
        self.cache.keys = [k.index_select(0, index)[:, :, first:] for k in self.cache.keys]
        self.cache.values = [v.index_select(0, index)[:, :, first:] for v in self.cache.values]
        self.cache.length -= first
        self.cache.max_length -= first
        self.mask = mask[:, first:]
        self.positions, self.tokens = self.positions.index_select(0, index), self.tokens.index_select(0, index)
        self.rows = [self.rows[i] for i in keep]
        self.sampling.select(keep)

    def ensure_capacity(self, needed: int) -> None:
        if needed <= self.cache.max_length:
            return
        grow = max(_GROWTH, needed - self.cache.max_length)
        pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, grow))  # noqa: E731  [B, H, S, D] on S
        self.cache.keys = [pad(k) for k in self.cache.keys]
        self.cache.values = [pad(v) for v in self.cache.values]
        self.cache.max_length += grow
        self.mask = torch.nn.functional.pad(self.mask, (0, grow))

    def extend(self, other: _Batch) -> None:
        """Append ``other``'s rows, right-aligning both caches at the longer length."""
        length = max(self.cache.length, other.cache.length)
        capacity = length + _GROWTH
        self.cache.keys = [_aligned(a, b, self.cache.length, other.cache.length, length, capacity)
                           for a, b in zip(self.cache.keys, other.cache.keys, strict=True)]
        self.cache.values = [_aligned(a, b, self.cache.length, other.cache.length, length, capacity)
                             for a, b in zip(self.cache.values, other.cache.values, strict=True)]
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


class BatchingEngine(ThreadedEngine):
    """``BatchingEngine(model, tokenizer, max_batch_size=32, max_queued=None)``; see the
    module docstring and :class:`ThreadedEngine` (fair, bounded inbox)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_batch_size: int = 32,
                 max_queued: int | None = None) -> None:
        self.model = model.eval()
        self.max_context = int(model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        self._batch: _Batch | None = None
        super().__init__(tokenizer, max_batch_size, max_queued)

    def _active(self) -> list[Sequence]:
        return list(self._batch.rows) if self._batch is not None else []

    def _busy(self) -> bool:
        return self._batch is not None

    def _clear(self) -> None:
        self._batch = None

    def _loop(self) -> None:
        with torch.inference_mode():
            super()._loop()

    # ---------------------------------------------------------------- one step (engine thread)
    def _step(self) -> None:
        self._drop(lambda s: s.handle.cancelled.is_set())
        joiners = self._take(self.max_batch_size - len(self._active()))
        if joiners:
            self._admit(joiners)
        if self._batch is not None:
            self._decode()

    def _drop(self, leaving) -> None:
        """Remove the rows for which ``leaving(sequence)`` holds (finished or cancelled)."""
        batch = self._batch
        if batch is None:
            return
        keep = []
        for row, sequence in enumerate(batch.rows):
            if sequence.done:
                self._stats.finished += 1
            elif leaving(sequence):
                self._release(sequence)
            else:
                keep.append(row)
        if not keep:
            self._batch = None
        elif len(keep) < len(batch.rows):
            batch.keep(keep)

    # ---------------------------------------------------------------- prefill
    def _admit(self, joiners: list[Sequence]) -> None:
        """Prefill the joiners (one forward per prompt length) and merge them into the batch."""
        by_length: dict[int, list[Sequence]] = {}
        for sequence in joiners:
            by_length.setdefault(len(sequence.request.prompt_ids), []).append(sequence)
        for group in by_length.values():
            batch = self._prefill(group)
            self._stats.prefills += 1
            if self._batch is None:
                self._batch = batch
            else:
                self._batch.extend(batch)
            self._drop(lambda s: False)  # rows that finished on their first token
        if self._batch is not None:
            self._stats.max_active = max(self._stats.max_active, len(self._batch.rows))

    def _prefill(self, group: list[Sequence]) -> _Batch:
        length = len(group[0].request.prompt_ids)
        ids = torch.tensor([s.request.prompt_ids for s in group], dtype=torch.long, device=self.device)
        weight = next(self.model.parameters())
        cache = KVCache(self.model.config, len(group), length, dtype=weight.dtype, device=self.device)
        logits = self.model(ids, kv_cache=cache, logits_to_keep=1)["logits"][:, -1]
        sampling = RowSampling([s.request.params for s in group], [s.rng for s in group], self.device,
                               [s.request.logit_bias for s in group], self.vocab_size)
        mask = torch.ones(len(group), length, dtype=torch.long, device=self.device)
        positions = torch.full((len(group), 1), length, dtype=torch.long, device=self.device)
        batch = _Batch(list(group), cache, mask, positions, torch.zeros(len(group), dtype=torch.long,
                                                                          device=self.device), sampling)
        batch.tokens = self._sample_and_record(batch, logits)
        return batch

    # ---------------------------------------------------------------- decode
    def _decode(self) -> None:
        batch = self._batch
        length = batch.cache.length
        batch.ensure_capacity(length + 1)
        batch.mask[:, length] = 1
        step_mask = batch.mask[:, :length + 1]
        padded = not bool(step_mask.all())
        logits = self.model(batch.tokens[:, None], attention_mask=step_mask if padded else None,
                            position_ids=batch.positions, kv_cache=batch.cache)["logits"][:, -1]
        batch.positions = batch.positions + 1
        self._stats.decode_steps += 1
        batch.tokens = self._sample_and_record(batch, logits)
        self._drop(lambda s: False)

    def _sample_and_record(self, batch: _Batch, logits: Tensor) -> Tensor:
        tokens, logprobs, scaled = batch.sampling.choose(logits)
        tops = _top_logprobs(scaled, [s.request.top_logprobs for s in batch.rows])
        for sequence, token, logprob, top in zip(batch.rows, tokens.tolist(), logprobs.tolist(), tops,
                                                 strict=True):
            sequence.record(token, logprob, top)
        return tokens


def _top_logprobs(scaled: Tensor, wanted: list[int]) -> list[list[tuple[int, float]] | None]:
    """Each row's ``wanted[row]`` most likely tokens with their log-probs (None where 0)."""
    k = max(wanted, default=0)
    if k <= 0:
        return [None] * len(wanted)
    values, indices = scaled.log_softmax(dim=-1).topk(min(k, scaled.shape[-1]), dim=-1)
    values, indices = values.tolist(), indices.tolist()
    return [list(zip(indices[r][:n], values[r][:n])) if n > 0 else None for r, n in enumerate(wanted)]
