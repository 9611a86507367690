"""Context parallelism, Ulysses-style: the tokens of each row split over the N ranks of a
context group.

Each rank holds a contiguous 1/N of every row (the embeddings, norms, MLPs and the head
work on it token by token). Attention needs the whole sequence: before it, an all-to-all
trades the sequence shard for a head shard (each rank then holds every token of H/N
query heads, and of their KV heads), attention runs over the whole rows with the whole
rows' mask or document layout, and a second all-to-all trades back. Both all-to-alls
are differentiable. KV heads that N does not divide are replicated to one per query head
first; query heads must divide by N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class ContextShard:
    """This rank's place in its context group, and the whole rows' positions and mask (a
    few integers per token: every rank builds the whole rows' attention bias from them)."""

    group: Any                      # the process group of the ranks that split the rows
    size: int                       # N
    rank: int                       # this rank's index in the group: its shard of tokens
    positions: Tensor               # [B, S] the whole rows' position ids (S divisible by N)
    attention_mask: Tensor | None   # [B, S] the whole rows' mask (1 = real), or None

    def local(self, tensor: Tensor) -> Tensor:
        """This rank's contiguous shard of ``tensor`` [B, S, ...] along dim 1."""
        width = tensor.shape[1] // self.size
        return tensor[:, self.rank * width:(self.rank + 1) * width]


def _all_to_all(tensor: Tensor, shard: ContextShard) -> Tensor:
    """Chunk i of dim 0 goes to rank i; chunk j of the result came from rank j (its
    backward is the same exchange of the gradients, the other way)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    return all_to_all_single_autograd(tensor.contiguous(), None, None, shard.group)


def sequence_to_heads(states: Tensor, shard: ContextShard) -> Tensor:
    """[B, heads, S/N, D] (this rank's tokens, every head) -> [B, heads/N, S, D] (every
    token, this rank's heads)."""
    batch, heads, width, dim = states.shape
    n = shard.size
    chunks = states.reshape(batch, n, heads // n, width, dim).transpose(0, 1)
    received = _all_to_all(chunks, shard)  # [N (token shard), B, heads/N, S/N, D]
    return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // n, n * width, dim)


def heads_to_sequence(states: Tensor, shard: ContextShard) -> Tensor:
    """The inverse: [B, heads/N, S, D] -> [B, heads, S/N, D]."""
    batch, heads, seq, dim = states.shape
    n = shard.size
    chunks = states.reshape(batch, heads, n, seq // n, dim).permute(2, 0, 1, 3, 4)
    received = _all_to_all(chunks, shard)  # [N (head shard), B, heads/N, S/N, D]
    return received.transpose(0, 1).reshape(batch, n * heads, seq // n, dim)


def kv_for_context(key: Tensor, value: Tensor, num_heads: int, size: int
                   ) -> tuple[Tensor, Tensor]:
    """KV heads split evenly over the group, or, where ``size`` does not divide them, one
    KV head per query head (each rank's query heads then find theirs)."""
    kv_heads = key.shape[1]
    if kv_heads % size == 0:
        return key, value
    group = num_heads // kv_heads
    return key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)


def split_rows(input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None,
               *, group: Any, size: int, rank: int) -> tuple[Tensor, ContextShard]:
    """This rank's shard of ``input_ids`` [B, S] and the group's :class:`ContextShard`.
    Rows are padded at the end to a multiple of ``size`` (padding: mask 0, positions
    counting on); positions default to 0..S-1."""
    batch, seq = input_ids.shape
    pad = (-seq) % size
    positions = position_ids if position_ids is not None else \
        torch.arange(seq, device=input_ids.device).expand(batch, seq)
    mask = attention_mask
    if pad:
        input_ids = torch.nn.functional.pad(input_ids, (0, pad))
        mask = torch.ones(batch, seq, dtype=torch.long, device=input_ids.device) \
            if mask is None else mask
        mask = torch.nn.functional.pad(mask, (0, pad))
        steps = torch.arange(1, pad + 1, device=input_ids.device)
        positions = torch.cat([positions, positions[:, -1:] + steps], dim=1)
    shard = ContextShard(group, size, rank, positions, mask)
    return shard.local(input_ids), shard


def next_token_targets(input_ids: Tensor, loss_mask: Tensor, shard: ContextShard
                       ) -> tuple[Tensor, Tensor]:
    """(targets, which are trained) [B, S/N] of this rank's positions: each position's
    target is the next token of the whole row (the last position's, on the last rank,
    is none), marked by ``loss_mask`` [B, S] of that token."""
    width = shard.positions.shape[1]
    targets = torch.zeros(input_ids.shape[0], width, dtype=input_ids.dtype,
                          device=input_ids.device)
    trained = torch.zeros(targets.shape, dtype=torch.bool, device=input_ids.device)
    seq = input_ids.shape[1]
    targets[:, :seq - 1] = input_ids[:, 1:]
    trained[:, :seq - 1] = loss_mask[:, 1:].bool()
    return shard.local(targets), shard.local(trained)
