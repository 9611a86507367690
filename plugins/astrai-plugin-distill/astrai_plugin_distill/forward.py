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

from astrai_core.api import chunked_logits_map, has_chunked_head
from astrai_plugin_distill.losses import TokenLoss


def student_token_losses(student: nn.Module, input_ids: Tensor, mask: Tensor,
                         teacher_side: tuple[Tensor, Tensor | None], loss: TokenLoss,
                         **forward: Any) -> dict[str, Any]:
    """The student's forward output with ``token_loss`` [M]: ``loss`` at every position
    predicting a ``mask`` [B, S - 1] token of ``input_ids[:, 1:]``, in row-major order.

    ``teacher_side``: :func:`astrai_plugin_distill.teacher.teacher_head`'s (hidden,
    weight), or (logits, None)."""
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
