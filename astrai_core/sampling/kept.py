"""Unfinished rows' KV caches kept from one generate call to the next
(``TorchSampler(keep_unfinished=True)``).

Partial rollouts send a sequence that a segment left unfinished again, as its prompt plus
the tokens it has so far. While the weights are those that computed them, that
sequence's keys and values are the ones the last call already had: the next call copies
them into its cache and computes only the last token, instead of the whole sequence.
A completion that ends unfinished (its ``max_new_tokens`` reached, or its call
interrupted) leaves its rows here, keyed by its prompt plus its tokens; the next call
takes what it continues and drops the rest. ``update_weights`` (which the rollout runner
calls after every optimizer step, and a Ray worker after every push) drops them all; as a
second guard the version counters of the model's parameters, which in-place updates
advance (a weight push's copy, an unfused optimizer step; a fused one does not), must
be those they were kept under. Rows kept under other weights are never used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from astrai_core.model.kv_cache import KVCache

Row = tuple[list[Tensor], list[Tensor]]  # per layer: keys, values [kv_heads, positions, head_dim]


def weights_stamp(model: torch.nn.Module) -> tuple[tuple[int, int], ...]:
    """Which tensors the model holds and how often each was changed in place."""
    return tuple((id(p), p._version) for p in model.parameters())


class KeptRows:
    """The rows the last generate call left unfinished, until the next call takes them."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, ...], list[Row]] = {}
        self.stamp: tuple[tuple[int, int], ...] | None = None

    def keep(self, model: torch.nn.Module, rows: list[tuple[list[int], Row]]) -> None:
        """Each ``(sequence, row)``: the keys and values of ``sequence`` but its last token."""
        stamp = weights_stamp(model)
        if stamp != self.stamp:
            self.rows, self.stamp = {}, stamp
        for sequence, row in rows:
            self.rows.setdefault(tuple(sequence), []).append(row)

    def take_all(self, model: torch.nn.Module) -> dict[tuple[int, ...], list[Row]]:
        """Every row kept under the model's current weights; the store empties."""
        rows = self.rows if self.stamp == weights_stamp(model) else {}
        self.clear()
        return rows

    def clear(self) -> None:
        self.rows, self.stamp = {}, None


def prefill_continuing(model: torch.nn.Module, input_ids: Tensor, cache: KVCache, *,
                       attention_mask: Tensor | None, position_ids: Tensor,
                       kept: list[Row | None], extra: dict,
                       prefill: Callable[[Tensor, KVCache], Tensor]) -> Tensor:
    """Fill ``cache`` with left-padded rows [B, S]: a row with ``kept[row]`` gets those
    keys and values for its first tokens and one forward of its last; the others are
    filled by ``prefill(rows, cache of those rows)``. The logits [B, V] of every row's
    next token."""
    width = input_ids.shape[1]
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    logits: Tensor | None = None
    again = [row for row, k in enumerate(kept) if k is not None]
    fresh = [row for row, k in enumerate(kept) if k is None]
    for rows in (fresh, again):
        if not rows:
            continue
        index = torch.tensor(rows, dtype=torch.long, device=input_ids.device)
        part = KVCache(model.config, len(rows), width, dtype=cache.keys[0].dtype,
                       device=cache.keys[0].device)
        if rows is fresh:
            out = prefill(index, part)
        else:
            _place(part, [kept[row] for row in rows], width - 1)
            step_mask = mask[index]
            out = model(input_ids[index, -1:], kv_cache=part, position_ids=position_ids[index, -1:],
                        attention_mask=None if bool(step_mask.all()) else step_mask,
                        **extra)["logits"][:, -1]
        for whole, piece in ((cache.keys, part.keys), (cache.values, part.values)):
            for layer, tensor in enumerate(piece):
                whole[layer][index, :, :width] = tensor[:, :, :width]
        logits = out.new_empty(len(kept), out.shape[1]) if logits is None else logits
        logits[index] = out
    cache.advance(width)
    assert logits is not None
    return logits


def _place(part: KVCache, rows: list[Row], end: int) -> None:
    """Each kept row's keys and values into ``part``, right-aligned at column ``end``."""
    for number, (keys, values) in enumerate(rows):
        length = keys[0].shape[1]
        for layer in range(len(part.keys)):
            part.keys[layer][number, :, end - length:end] = keys[layer]
            part.values[layer][number, :, end - length:end] = values[layer]
    part.length = end
