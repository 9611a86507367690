"""Forwards over whole sequences whose tokens a context group splits
(``parallel.context_parallel``), for the strategies whose loss is a function of whole rows
(preference pairs, rewards, distillation): each rank runs its contiguous shard of every
row, and what the loss needs of the whole rows is gathered
(:func:`~astrai_core.distributed.context_rows.gather_shards`), so every rank of the group
computes the same loss (the trainer counts the group once). Without a context group they
are the plain forwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from astrai_core.distributed.context import DistContext
from astrai_core.data.image_batch import NOT_SPLIT
from astrai_core.distributed.context_rows import whole_row_logprobs
from astrai_core.errors import ConfigError
from astrai_core.model.context_parallel import ContextShard, split_rows
from astrai_core.model.head import predicting_positions, target_logprobs


def splits_rows(dist: DistContext | None) -> bool:
    """Whether ``dist`` splits each row's tokens over a context group of several ranks."""
    return dist is not None and dist.context_size > 1


def context_split(input_ids: Tensor, dist: DistContext, *,
                  attention_mask: Tensor | None = None, position_ids: Tensor | None = None
                  ) -> tuple[Tensor, ContextShard]:
    """This rank's shard of ``input_ids`` [B, S] (rows padded at the end to a multiple of
    the group's size) and the :class:`ContextShard` the model's forward takes with it
    (``model(local, context_shard=shard, ...)``); see :func:`local_part` for this rank's
    part of any whole-rows tensor."""
    return split_rows(input_ids, attention_mask, position_ids, group=dist.context_group,
                      size=dist.context_size, rank=dist.context_rank)


def local_part(tensor: Tensor, shard: ContextShard) -> Tensor:
    """This rank's part of ``tensor`` [B, T, ...] (T at most the rows' length), indexed by
    position like the rows: zero-padded at the end to the shard's padded width first."""
    width = shard.positions.shape[1]
    padded = tensor.new_zeros((tensor.shape[0], width, *tensor.shape[2:]))
    padded[:, :tensor.shape[1]] = tensor
    return shard.local(padded)


def context_target_logprobs(model: torch.nn.Module, input_ids: Tensor, target_ids: Tensor,
                            dist: DistContext | None = None, temperature: float = 1.0, *,
                            attention_mask: Tensor | None = None,
                            position_ids: Tensor | None = None,
                            images: Mapping[str, Tensor] | None = None) -> dict[str, Any]:
    """:func:`~astrai_core.model.head.target_logprobs` (``logprobs`` [B, T] of
    ``target_ids``, the last T tokens of ``input_ids``, and ``aux_loss``); with a context
    group, each rank scores its shard's positions and every rank gets the whole rows'
    log-probs, differentiably (``aux_loss`` is then this rank's shard's). ``images``: a
    vision-language model's image inputs for the rows' image tokens (rows with images are
    not split over a context group)."""
    if not splits_rows(dist):
        return target_logprobs(model, input_ids, target_ids, temperature,
                               attention_mask=attention_mask, position_ids=position_ids,
                               **({"images": images} if images else {}))
    if images:
        raise ConfigError(NOT_SPLIT)
    positions = predicting_positions(input_ids.shape[1], target_ids.shape[1])
    targets = torch.zeros_like(input_ids)
    targets[:, positions] = target_ids
    out = whole_row_logprobs(model, input_ids, targets, dist, position_ids=position_ids,
                             attention_mask=attention_mask, temperature=temperature)
    return {"logprobs": out["logprobs"][:, positions], "aux_loss": out["aux_loss"]}
