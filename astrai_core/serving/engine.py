"""Continuous batching with the live native model: one decode batch shared by every client.

A background thread runs the loop. At each step boundary it drops cancelled sequences
(a disconnected client frees its slot before the next forward), admits waiting requests
(prefilled in groups of equal prompt length, then merged into the running batch's KV
cache), and runs one decode forward for every active sequence. Sequences leave the
batch as soon as they finish.

The running batch (its left-padded KV cache, joins and leaves) is
:class:`~astrai_core.sampling.running_batch.RunningBatch`, which the torch sampler shares.
Sampling is :class:`~astrai_core.sampling.rows.RowSampling`, the torch sampler's own,
with the same per-request random streams, so a seeded request samples the same tokens
here and in ``TorchSampler.generate``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from astrai_core.sampling.rows import RowSampling
from astrai_core.sampling.running_batch import RunningBatch, decode, prefill
from astrai_core.serving.engine_base import ThreadedEngine
from astrai_core.serving.sequence import Sequence

class BatchingEngine(ThreadedEngine):
    """``BatchingEngine(model, tokenizer, max_batch_size=32, max_queued=None)``; see the
    module docstring and :class:`ThreadedEngine` (fair, bounded inbox)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_batch_size: int = 32,
                 max_queued: int | None = None) -> None:
        self.model = model.eval()
        self.max_context = int(model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        self._batch: RunningBatch | None = None
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

    def _prefill(self, group: list[Sequence]) -> RunningBatch:
        sampling = RowSampling([s.request.params for s in group], [s.rng for s in group], self.device,
                               [s.request.logit_bias for s in group], self.vocab_size)
        batch, logits = prefill(self.model, group, [s.request.prompt_ids for s in group], sampling)
        batch.tokens = self._sample_and_record(batch, logits)
        return batch

    # ---------------------------------------------------------------- decode
    def _decode(self) -> None:
        batch = self._batch
        logits = decode(self.model, batch)
        self._stats.decode_steps += 1
        batch.tokens = self._sample_and_record(batch, logits)
        self._drop(lambda s: False)

    def _sample_and_record(self, batch: RunningBatch, logits: Tensor) -> Tensor:
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
