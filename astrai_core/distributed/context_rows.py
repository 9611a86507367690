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


class _GatherShards(torch.autograd.Function):
    """All-gather along dim 1 over the context group; the backward sums the group's
    gradients of the whole tensor and keeps this rank's shard of them. Every rank of the
    group computes the same loss from the whole rows, so each shard's gradient comes N
    times, as every replicated parameter's does: the gradient reduction's mean over the
    ranks (or the trainer's division by the summed loss weights) divides it back out."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, group: Any, size: int, rank: int
                ) -> torch.Tensor:
        ctx.group, ctx.size, ctx.rank = group, size, rank
        parts = [torch.empty_like(shard) for _ in range(size)]
        torch.distributed.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        total = grad.contiguous().clone()
        torch.distributed.all_reduce(total, group=ctx.group)
        width = total.shape[1] // ctx.size
        return total[:, ctx.rank * width:(ctx.rank + 1) * width], None, None, None


def gather_shards(shard: torch.Tensor, dist: DistContext) -> torch.Tensor:
    """The context group's [B, S/N, ...] shards as whole rows [B, S, ...] on each of its
    ranks, differentiably (see :class:`_GatherShards`)."""
    return _GatherShards.apply(shard, dist.context_group, dist.context_size, dist.context_rank)


def whole_row_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                       targets: torch.Tensor, dist: DistContext, *,
                       position_ids: torch.Tensor | None = None,
                       attention_mask: torch.Tensor | None = None, temperature: float = 1.0,
                       with_entropy: bool = False, return_hidden_states: bool = False
                       ) -> dict[str, Any]:
    """The log-prob of ``targets[b, p]`` under the model's distribution at position p of
    ``input_ids`` [B, S], for every position, whole rows on every rank of the context
    group: each rank runs its shard of the tokens (the chunked head scores its own
    positions), then the group's shards are gathered (:func:`gather_shards`). Also
    ``entropy`` [B, S] and ``hidden_states`` [B, S, H] when asked, and ``aux_loss``
    (this rank's shard's). The loss a rank computes from them is the whole rows'."""
    seq = input_ids.shape[1]
    local, shard = split_rows(input_ids, attention_mask, position_ids,
                              group=dist.context_group, size=dist.context_size,
                              rank=dist.context_rank)
    padded = torch.nn.functional.pad(targets, (0, shard.positions.shape[1] - seq))
    local_targets = shard.local(padded)

    def head(hidden: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        logprobs, entropy = chunked_logprobs(hidden, weight, local_targets, temperature,
                                             with_entropy=with_entropy)
        out = {"logprobs": logprobs.clone()}  # fresh tensors for FSDP2's output hooks
        if entropy is not None:
            out["entropy"] = entropy.clone()
        return out

    out = model(local, context_shard=shard, head=head,
                return_hidden_states=return_hidden_states)
    names = ["logprobs"] + (["entropy"] if with_entropy else []) + \
        (["hidden_states"] if return_hidden_states else [])
    result: dict[str, Any] = {name: gather_shards(out[name], dist)[:, :seq]
                              for name in names}
    result["aux_loss"] = out.get("aux_loss")
    return result
