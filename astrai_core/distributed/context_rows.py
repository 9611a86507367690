"""A token batch's next-token log-probs under context parallelism: every rank of a context
group holds the same rows and computes its contiguous shard of their tokens
(:mod:`astrai_core.model.context_parallel`). Each rank's log-probs are its own positions',
so a loss summed over its targets and weighted by their count (``loss_weight``) adds up,
over the group and the data-parallel ranks, to the one-process loss."""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.distributed.context import DistContext
from astrai_core.model.context_parallel import next_token_targets, split_rows
from astrai_core.model.head import chunked_logprobs


def context_parallel_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                              dist: DistContext) -> dict[str, Any]:
    """The model's output on this rank's shard of ``batch`` (``input_ids``, optional
    ``attention_mask``, ``position_ids``, ``loss_mask``), with ``logprobs`` [B, S/N] of
    each shard position's next token and ``trained`` [B, S/N] where that token is a
    target."""
    ids = batch["input_ids"]
    local, shard = split_rows(ids, batch.get("attention_mask"), batch.get("position_ids"),
                              group=dist.context_group, size=dist.context_size,
                              rank=dist.context_rank)
    loss_mask = batch.get("loss_mask", torch.ones_like(ids))
    targets, trained = next_token_targets(ids, loss_mask, shard)

    def head(hidden: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        logprobs, _ = chunked_logprobs(hidden, weight, targets)
        return {"logprobs": logprobs.clone()}  # a fresh tensor for FSDP2's output hooks

    output = model(local, context_shard=shard, head=head)
    output["trained"] = trained
    return output
