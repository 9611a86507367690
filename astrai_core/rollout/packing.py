"""Rollout rows trained without padding (``trainer.micro_batch_tokens``).

:func:`token_micro_batches` cuts an optimizer step's rows into micro-batches of at most N
real tokens; each is marked ``packed``, and :func:`packed_forward` runs such a batch as
ONE sequence of its real tokens: each row's [prompt | response] one after the other,
positions restarting at 0 for every row, so the model keeps the rows apart (the native
model computes attention per document, ``model/document_attention.py``, as for SFT
packing). Its outputs are scattered back to
the batch's padded [N, R] layout, so the loss, the advantages and every metric are
computed exactly as on the padded batch; only the padding's compute is gone.

With ``trainer.share_prompt`` (``batch.share_prompt``) rows with the same prompt (a group's
G completions) compute it once: the first such row keeps it, each other row packs only its
response, whose attention sees that prompt and itself; its first token is scored at the
prompt's last position, the one every completion of the group shares.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from astrai_core.distributed.context import DistContext
from astrai_core.distributed.context_rows import whole_row_logprobs
from astrai_core.model.document_attention import DocumentLayout
from astrai_core.model.head import chunked_logprobs
from astrai_core.rollout.batch import RolloutBatch


def packed_forward(model: torch.nn.Module, batch: RolloutBatch, temperature: float,
                   return_hidden_states: bool, return_entropy: bool,
                   context: DistContext | None = None) -> dict[str, Any]:
    """:func:`~astrai_core.rollout.forward.policy_forward`'s outputs for a packed batch, or
    for one whose rows share their prompts (``batch.share_prompt``).

    The model must compute log-probs inside its forward (a native model: its ``head=``
    argument); values at the response's padding are 0. ``context``: the packed sequence's
    tokens split over a context group (not with shared prompts).
    """
    mask = batch.attention_mask().bool()  # [N, P + R]: real tokens, contiguous per row
    width = batch.prompt_ids.shape[1]
    owners = _prompt_owners(batch) if batch.share_prompt else list(range(len(batch)))
    kept = mask.clone()  # the tokens computed: a row sharing another's prompt drops its own
    for row, owner in enumerate(owners):
        if owner != row:
            kept[row, :width] = False
    flat_ids = batch.input_ids()[kept][None]  # [1, T]
    positions = batch.position_ids()[kept][None]  # 0 at each prompt's first token
    flat_index = _flat_index(kept, owners, width)
    scored = mask[:, width:]  # [N, R] real response tokens (environment tokens included)
    # a response token is scored at the token before it: its row's, or its prompt's last
    predicting = flat_index[:, width - 1:-1][scored]
    targets = batch.response_ids[scored]

    def head(hidden: Tensor, weight: Tensor) -> dict[str, Tensor]:
        logprobs, entropy = chunked_logprobs(hidden[0, predicting], weight, targets,
                                             temperature, with_entropy=return_entropy)
        out = {"logprobs": logprobs}
        if entropy is not None:
            out["entropy"] = entropy
        return out

    if context is not None:
        if batch.share_prompt:
            raise ValueError("shared prompts are not split over a context group")
        flat_targets = torch.zeros_like(flat_ids)
        flat_targets[0, predicting] = targets
        out = whole_row_logprobs(model, flat_ids, flat_targets, context, position_ids=positions,
                                 temperature=temperature, with_entropy=return_entropy,
                                 return_hidden_states=return_hidden_states)
        out.update({name: out[name][0, predicting] for name in ("logprobs", "entropy")
                    if name in out})
    else:
        layout = {"document_layout": _shared_layout(kept, owners, flat_index, width)} \
            if batch.share_prompt else {}
        out = model(flat_ids, position_ids=positions, head=head,
                    return_hidden_states=return_hidden_states, **layout)
    result: dict[str, Any] = {"logprobs": _unpack(out["logprobs"], scored),
                              "aux_loss": out.get("aux_loss")}
    if return_entropy:
        result["entropy"] = _unpack(out["entropy"], scored)
    if return_hidden_states:
        result["hidden_states"] = _unpack(out["hidden_states"][0, predicting], scored)
    return result


def _prompt_owners(batch: RolloutBatch) -> list[int]:
    """Per row, the first row with the same real prompt tokens (itself, for the first):
    the G completions of a group, wherever they lie in the batch. A row with no prompt
    token owns itself (it has no prefix to share)."""
    seen: dict[tuple[int, ...], int] = {}
    owners = []
    for row, (ids, real) in enumerate(zip(batch.prompt_ids.tolist(),
                                          batch.prompt_mask.tolist(), strict=True)):
        prompt = tuple(token for token, keep in zip(ids, real, strict=True) if keep)
        owners.append(seen.setdefault(prompt, row) if prompt else row)
    return owners


def _flat_index(kept: Tensor, owners: list[int], width: int) -> Tensor:
    """[N, P + R] index in the packed sequence of each row's token in each column: its own
    for the tokens it computes, its prompt owner's for the prompt it shares (-1 where
    nothing is: padding)."""
    index = kept.reshape(-1).long().cumsum(0).reshape(kept.shape) - 1
    index = index.masked_fill(~kept, -1)
    for row, owner in enumerate(owners):
        if owner != row:
            index[row, :width] = index[owner, :width]
    return index


def _shared_layout(kept: Tensor, owners: list[int], flat_index: Tensor,
                   width: int) -> DocumentLayout:
    """The packed sequence's segments: a row owning its prompt is one segment (prompt and
    response); a row sharing it is its response, with its owner's prompt as prefix."""
    spans: list[tuple[int, int, bool]] = []
    prefixes: list[tuple[int, int] | None] = []
    start = 0
    for row, count in enumerate(kept.sum(-1).tolist()):
        if not count:
            continue
        spans.append((start, start + count, True))
        owner = owners[row]
        prompt = flat_index[owner, :width][kept[owner, :width]]
        prefixes.append(None if owner == row else (int(prompt[0]), int(prompt[-1]) + 1))
        start += count
    bounds = torch.tensor([0] + [end for _, end, _ in spans], dtype=torch.int32)
    return DocumentLayout(spans, bounds, max((b - a for a, b, _ in spans), default=0),
                          prefixes=prefixes)


def _unpack(values: Tensor, scored: Tensor) -> Tensor:
    """[M, ...] values of the scored positions -> [N, R, ...], 0 elsewhere (differentiable)."""
    out = values.new_zeros((*scored.shape, *values.shape[1:]))
    return out.index_put((*scored.nonzero(as_tuple=True),), values)


def token_micro_batches(batch: RolloutBatch, max_tokens: int, world: int = 1
                        ) -> list[RolloutBatch]:
    """``batch``'s rows, in order, cut into packed micro-batches of at most ``max_tokens``
    real tokens per process. Rows go in whole steps of ``world`` (so that each micro-batch
    splits evenly over the data-parallel ranks, rank r taking the r-th contiguous share);
    a step longer than the budget on its own makes a micro-batch by itself."""
    lengths = batch.attention_mask().sum(-1).tolist()
    if len(lengths) % world:
        raise ValueError(f"{len(lengths)} rows cannot be split evenly over {world} ranks")
    parts: list[list[int]] = []
    current: list[int] = []
    for start in range(0, len(lengths), world):
        candidate = current + list(range(start, start + world))
        if current and _largest_share(candidate, lengths, world) > max_tokens:
            parts.append(current)
            candidate = list(range(start, start + world))
        current = candidate
    if current:
        parts.append(current)
    return [_packed(batch.select(rows)) for rows in parts]


def _largest_share(rows: list[int], lengths: list[int], world: int) -> int:
    """The most tokens any rank gets when ``rows`` are split in ``world`` contiguous shares."""
    share = len(rows) // world
    return max(sum(lengths[i] for i in rows[r * share:(r + 1) * share]) for r in range(world))


def _packed(batch: RolloutBatch) -> RolloutBatch:
    batch.packed = True
    return batch


def padding_fraction(batches: list[RolloutBatch]) -> float:
    """The share of the training forwards' token slots that are padding (0 when packed)."""
    real = [int(b.attention_mask().sum()) for b in batches]
    slots = sum(n if b.packed else b.attention_mask().numel() for b, n in zip(batches, real))
    return 1.0 - sum(real) / slots if slots else 0.0
