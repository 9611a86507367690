"""One global rollout from every rank's share.

Each rank samples and scores its own prompts (whole groups), and runs the no-grad
forwards of its rows (trainer log-probs, critic values, reference log-probs). The
rollout is then gathered on every rank, so that whatever is global is computed exactly
as in one process: advantage statistics and GAE whitening, the rollout's metrics, and
the shuffled schedule of optimizer steps, of which each rank trains its share of rows.
Rows are padded to the widest rank (prompts on the left, responses on the right); group
ids are renumbered to global prompt indices. A vision-language model's image tensors
(``RolloutBatch.images``) travel with their rows, each padded to the most images of a row
over every rank, so each rank's training forwards get its rows' images. The ranks of a
context group (``parallel.context_parallel``) hold the same rows
(:func:`context_group_rollout`): the rollout has them once.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import torch
import torch.nn.functional as F

from astrai_core.distributed.context import DistContext
from astrai_core.model.router_replay import ROUTED_EXPERTS, widened_routing
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.images import ImageLayout, conformed_images, image_layout, joint_layout

_PROMPT_ALIGNED = ("prompt_ids", "prompt_mask")
_ROW_LISTS = ("prompts", "completions", "columns", "finish_reasons")


def _pad_width(tensor: torch.Tensor, width: int, left: bool) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    pad = [0, 0] * (tensor.dim() - 2) + ([missing, 0] if left else [0, missing])
    return F.pad(tensor, pad)  # zeros / False: padding is told apart by the masks


def context_group_rollout(rollout: RolloutBatch, dist: DistContext) -> RolloutBatch:
    """The rollout of this rank's context group, on each of its ranks: every rank sampled
    its share of the group's prompts (``DistContext.sampling_slice``), gathered here in
    rank order, so the group's forwards split one set of rows (the identity without
    context parallelism)."""
    if dist.context_size == 1:
        return rollout
    return gather_rollout(rollout, dist.context_view())[0]


def gather_rollout(rollout: RolloutBatch, dist: DistContext,
                   token_tensors: dict[str, torch.Tensor] | None = None
                   ) -> tuple[RolloutBatch, dict[str, torch.Tensor]]:
    """Every rank's ``rollout`` (and ``token_tensors``, [N, R] each) concatenated in rank
    order; the identity in a one-process run."""
    token_tensors = dict(token_tensors or {})
    if not dist.enabled:
        return rollout, token_tensors
    widths = dist.all_gather_object((rollout.prompt_ids.shape[1], rollout.response_ids.shape[1],
                                     image_layout(rollout.images)))
    prompt_width = max(w[0] for w in widths)
    local_response = rollout.response_ids.shape[1]
    response_width = max(w[1] for w in widths)

    def gathered(name: str, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None:
            return None
        if name in _PROMPT_ALIGNED:
            tensor = _pad_width(tensor, prompt_width, left=True)
        elif name == ROUTED_EXPERTS:  # [N, L, P + R, k]: both sides (router replay);
            tensor = widened_routing(tensor, rollout.prompt_ids.shape[1], prompt_width,
                                     response_width)  # gloo gathers no int16: as int32
            return _rows(tensor.int(), dist).to(tensor.dtype)
        elif tensor.dim() >= 2 and tensor.shape[1] == local_response:
            tensor = _pad_width(tensor, response_width, left=False)
        return _rows(tensor, dist)

    tensor_fields = [f.name for f in fields(RolloutBatch)
                     if isinstance(getattr(rollout, f.name), torch.Tensor) or
                     (getattr(rollout, f.name) is None and f.name not in _ROW_LISTS)]
    tensor_fields.remove("group_ids")  # renumbered below
    present = dist.all_gather_object(sorted(n for n in tensor_fields
                                            if getattr(rollout, n) is not None))
    if any(names != present[0] for names in present):
        raise RuntimeError(f"the ranks' rollouts carry different fields: {present}")
    updates: dict[str, Any] = {name: gathered(name, getattr(rollout, name))
                               for name in tensor_fields}
    updates["reward_components"] = {k: gathered(k, v)
                                    for k, v in sorted(rollout.reward_components.items())}
    updates["extras"] = {k: gathered(k, v) for k, v in sorted(rollout.extras.items())}
    counts = dist.all_gather_object(int(rollout.group_ids.max().item()) + 1
                                    if len(rollout) else 0)[::dist.context_size]
    offset = sum(counts[:dist.data_rank])
    group_ids = _rows(rollout.group_ids + offset, dist)
    updates["group_ids"] = group_ids
    for name in _ROW_LISTS:
        parts = dist.all_gather_object(getattr(rollout, name))[::dist.context_size]
        updates[name] = [item for part in parts for item in part]
    updates["images"] = _gathered_images(rollout, [w[2] for w in widths], prompt_width, dist)
    tokens = {k: gathered(k, v) for k, v in sorted(token_tensors.items())}
    return replace(rollout, **updates), tokens


def _gathered_images(rollout: RolloutBatch, layouts: list[ImageLayout], prompt_width: int,
                     dist: DistContext) -> dict[str, torch.Tensor]:
    """Every rank's image tensors of its rows (rollout/images.py), row-aligned like the
    rest: a rank's rows may hold more images (or Qwen-VL patches, Idefics3 tiles) than
    another's, or none, so each rank first pads its own to the joint layout."""
    layout = joint_layout(layouts)
    if not layout:
        return {}
    local = conformed_images(rollout.images, len(rollout), layout, prompt_width,
                             rollout.prompt_ids.device)
    return {key: _rows(value, dist) for key, value in local.items()}


def _rows(tensor: torch.Tensor, dist: DistContext) -> torch.Tensor:
    """Every data-parallel rank's ``tensor`` (the same shape on each) concatenated along
    dim 0: each context group's rows once."""
    joined = dist.all_gather_rows(tensor)
    if dist.context_size == 1:
        return joined
    rest = joined.shape[1:]
    per_rank = joined.reshape(dist.data_world, dist.context_size, -1, *rest)
    return per_rank[:, 0].reshape(-1, *rest)
