"""A request's datums shared out over the processes of a multi-process server.

Each rank runs forward (and backward) on its own contiguous share of the datums; the
adapter's gradients are summed over the ranks before a step, so every rank's copy of
the adapter steps the same. A rank whose share is empty (fewer datums than ranks) still
runs the forward and backward of the first datum with its loss scaled by 0: the sharded
base needs every rank in each layer's collectives.
"""

from __future__ import annotations

import numpy as np
import torch

from astrai_core.distributed.context import DistContext

OUTPUT_KEYS = ("logprobs", "elementwise_loss")  # what a forward returns per datum


def rank_rows(count: int, dist: DistContext) -> slice:
    """This rank's datums of ``count``: contiguous, the first ``count % world`` ranks one more."""
    share, extra = divmod(count, dist.world_size)
    start = dist.rank * share + min(dist.rank, extra)
    return slice(start, start + share + (dist.rank < extra))


def gather_outputs(mine: list[dict[str, np.ndarray]], lengths: list[int],
                   dist: DistContext) -> list[dict[str, np.ndarray]]:
    """Every datum's outputs, in request order, from each rank's ``mine`` (``lengths``:
    every datum's token count, which every rank knows)."""
    shares = [rank_rows(len(lengths), DistContext(rank=r, world_size=dist.world_size))
              for r in range(dist.world_size)]
    sizes = [len(OUTPUT_KEYS) * sum(lengths[share]) for share in shares]
    local = np.zeros(max(sizes), dtype=np.float32)
    flat = [out[key] for out in mine for key in OUTPUT_KEYS]
    if flat:
        local[:sizes[dist.rank]] = np.concatenate(flat)
    parts = [torch.empty(max(sizes), dtype=torch.float32, device=dist.device)
             for _ in range(dist.world_size)]
    torch.distributed.all_gather(parts, torch.from_numpy(local).to(dist.device))
    outputs = []
    for share, part in zip(shares, parts, strict=True):
        values, offset = part.cpu().numpy(), 0
        for length in lengths[share]:
            out = {}
            for key in OUTPUT_KEYS:
                out[key] = values[offset:offset + length].copy()
                offset += length
            outputs.append(out)
    return outputs


def sum_gradients(params: list[torch.nn.Parameter], dist: DistContext) -> None:
    """Each parameter's gradient summed over the ranks, in place (one collective)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not dist.enabled or not grads:
        return
    total = dist.sum_tensor(torch.cat([g.flatten() for g in grads]))
    offset = 0
    for grad in grads:
        grad.copy_(total[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
