"""The student's forward over a token batch with the distillation loss as its head.

The per-token loss is computed inside the student's forward (its ``head=`` argument),
chunk by chunk over the response tokens only (:func:`astrai_core.api.chunked_logits_map`):
each chunk's student logits and teacher logits exist only while that chunk is scored, and
under FSDP2 the student's head is the one its forward gathered, so its gradient is
reduce-scattered by the same unit's backward. Models without the chunked head fall back
to their full logits.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from astrai_core.api import (chunked_logits_map, context_split, gather_shards,
                             has_chunked_head, local_part, splits_rows)
from astrai_plugin_distill.losses import TokenLoss


def student_token_losses(student: nn.Module, input_ids: Tensor, mask: Tensor,
                         teacher_side: tuple[Tensor, Tensor | None], loss: TokenLoss,
                         dist: Any = None, **forward: Any) -> dict[str, Any]:
    """The student's forward output with ``token_loss`` [M]: ``loss`` at every position
    predicting a ``mask`` [B, S - 1] token of ``input_ids[:, 1:]``, in row-major order.

    ``teacher_side``: :func:`astrai_plugin_distill.teacher.teacher_head`'s (hidden,
    weight), or (logits, None). ``dist`` (the run's): with ``parallel.context_parallel``
    each rank scores its shard's positions (the teacher's side must be that shard's too)
    and every rank of the group gets the whole rows' token losses."""
    if splits_rows(dist):
        return _context_token_losses(student, input_ids, mask, teacher_side, loss, dist,
                                     **forward)
    targets = input_ids[:, 1:][mask]
    t_rows, t_weight = teacher_side
    if not has_chunked_head(student):
        out = student(input_ids, **forward)
        s_logits = out["logits"][:, :-1][mask].float()
        t_logits = t_rows if t_weight is None else F.linear(t_rows, t_weight).float()
        out["token_loss"] = loss(s_logits, t_logits, targets)
        return out

    def head(hidden: Tensor, weight: Tensor) -> dict[str, Tensor]:
        s_rows = hidden[:, :-1][mask]
        if t_weight is None:  # the teacher's logits come whole, chunked as extra rows
            return {"token_loss": chunked_logits_map(loss, [(s_rows, weight)], t_rows, targets)}
        return {"token_loss": chunked_logits_map(loss, [(s_rows, weight), (t_rows, t_weight)],
                                                 targets)}

    return student(input_ids, head=head, **forward)


def _context_token_losses(student: nn.Module, input_ids: Tensor, mask: Tensor,
                          teacher_side: tuple[Tensor, Tensor | None], loss: TokenLoss,
                          dist: Any, attention_mask: Tensor | None = None,
                          position_ids: Tensor | None = None) -> dict[str, Any]:
    """:func:`student_token_losses` of rows split over a context group: this rank's token
    losses, put back at their positions, are gathered into the whole rows' (a few floats
    per token), so that every aggregation sees whole rows."""
    t_rows, t_weight = teacher_side
    local, shard = context_split(input_ids, dist, attention_mask=attention_mask,
                                 position_ids=position_ids)
    local_mask = local_part(mask, shard)
    targets = local_part(input_ids[:, 1:], shard)[local_mask]

    def head(hidden: Tensor, weight: Tensor) -> dict[str, Tensor]:
        token_loss = chunked_logits_map(loss, [(hidden[local_mask], weight), (t_rows, t_weight)],
                                        targets)
        per_position = token_loss.new_zeros((*local_mask.shape, *token_loss.shape[1:]))
        per_position[local_mask] = token_loss
        return {"token_loss": per_position}

    out = student(local, context_shard=shard, head=head)
    whole = gather_shards(out["token_loss"], dist)[:, :mask.shape[1]]
    out["token_loss"] = whole[mask]
    return out
