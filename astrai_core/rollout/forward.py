"""The trainer-side forward over a rollout: log-probs (and entropy, hidden states) of the
response tokens. Every strategy and the sampler agreement test use :func:`policy_forward`;
the per-rollout no-grad forwards (old and reference log-probs, critic values) go through
:func:`rollout_forward`, which packs them like the training micro-batches."""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.distributed.context import DistContext
from astrai_core.distributed.context_rows import whole_row_logprobs
from astrai_core.model.head import has_chunked_head, predicting_positions, target_logprobs
from astrai_core.errors import ConfigError
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.images import forward_images
from astrai_core.rollout.packing import packed_forward, token_micro_batches


def policy_forward(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0,
                   return_hidden_states: bool = False, return_entropy: bool = False,
                   dist: DistContext | None = None) -> dict[str, Any]:
    """One forward over [prompt | response]; values aligned with the response tokens.

    Returns ``logprobs`` [N, R] (log_softmax(logits / temperature) of each response token,
    from the logits at the position BEFORE it), ``entropy`` [N, R] when asked,
    ``hidden_states`` [N, R, H] at those same positions when asked (a value head on them
    gives V(s_t), the value before action t, with no extra shift) and ``aux_loss`` (MoE).
    Padding positions hold finite numbers that callers mask with ``response_mask``.
    A native model computes the log-probs with its chunked head (model/head.py). A
    ``packed`` batch runs as one sequence of its real tokens, and one that shares its
    prompts (``share_prompt``) as one sequence with each prompt once (rollout/packing.py).

    ``dist`` with ``context_size`` N > 1 (``parallel.context_parallel``): the ranks of a
    context group hold the same rows and each computes its shard of their tokens; the
    outputs are the whole rows' on every one of them (distributed/context_rows.py).
    """
    context = dist if dist is not None and dist.context_size > 1 else None
    if batch.images and (batch.packed or batch.share_prompt or context is not None):
        # a row's image features fill its own image tokens: rows are run whole and apart
        raise ConfigError("rollouts with images are trained one padded row per prompt "
                          "sample: leave out trainer.micro_batch_tokens, "
                          "trainer.share_prompt and parallel.context_parallel")
    if batch.packed or batch.share_prompt:
        return packed_forward(model, batch, temperature, return_hidden_states, return_entropy,
                              context)
    if context is not None:
        return _context_forward(model, batch, temperature, return_hidden_states,
                                return_entropy, context)
    out = target_logprobs(model, batch.input_ids(), batch.response_ids, temperature,
                          with_entropy=return_entropy, attention_mask=batch.attention_mask(),
                          position_ids=batch.position_ids(),
                          return_hidden_states=return_hidden_states,
                          **_image_inputs(model, batch))
    result: dict[str, Any] = {"logprobs": out["logprobs"], "aux_loss": out.get("aux_loss")}
    if return_entropy:
        result["entropy"] = out["entropy"]
    if return_hidden_states:
        hidden = out["hidden_states"]
        result["hidden_states"] = hidden[:, predicting_positions(hidden.shape[1],
                                                                 batch.response_ids.shape[1])]
    return result


def _image_inputs(model: torch.nn.Module, batch: RolloutBatch) -> dict[str, Any]:
    """The ``images`` keyword of the forward over ``batch``'s rows, when they hold any."""
    images = forward_images(model, batch.images, batch.response_ids.shape[1])
    return {"images": images} if images else {}


def _context_forward(model: torch.nn.Module, batch: RolloutBatch, temperature: float,
                     return_hidden_states: bool, return_entropy: bool,
                     dist: DistContext) -> dict[str, Any]:
    """:func:`policy_forward` of a padded batch whose rows' tokens are split over the
    context group: every position's next token scored on its rank, the response's kept."""
    ids = batch.input_ids()
    targets = torch.nn.functional.pad(ids[:, 1:], (0, 1))  # position p predicts token p + 1
    out = whole_row_logprobs(model, ids, targets, dist, position_ids=batch.position_ids(),
                             attention_mask=batch.attention_mask(), temperature=temperature,
                             with_entropy=return_entropy,
                             return_hidden_states=return_hidden_states)
    response = predicting_positions(ids.shape[1], batch.response_ids.shape[1])
    result = {name: value[:, response] for name, value in out.items() if name != "aux_loss"}
    result["aux_loss"] = out["aux_loss"]
    return result


def rollout_forward(model: torch.nn.Module, rollout: RolloutBatch, temperature: float = 1.0,
                    micro_batch_tokens: int | None = None,
                    return_hidden_states: bool = False, dist: Any = None) -> dict[str, Any]:
    """:func:`policy_forward` over a whole (unpacked) rollout, for the no-grad forwards
    made once per rollout.

    With ``micro_batch_tokens`` (``trainer.micro_batch_tokens``) and a native model the
    rollout's rows run in packed micro-batches of at most that many real tokens, as the
    training micro-batches do, so no padding is computed; the outputs are put back in the
    rollout's [N, R(, H)] layout in row order. ``aux_loss`` is then the micro-batches'
    mean (MoE; no caller of a no-grad forward reads it). Otherwise: one padded forward.

    ``dist`` (a run's DistContext): the ranks run their own rows, so their numbers of
    micro-batches may differ, while a sharded model's forward is a collective (FSDP
    gathers each layer's weights): a rank with fewer runs its last micro-batch again,
    its outputs unused, until every rank has run as many forwards.
    """
    if micro_batch_tokens is None or not has_chunked_head(model):
        return policy_forward(model, rollout, temperature, return_hidden_states, dist=dist)
    # world=1: each rank runs its own rows, before they are gathered
    batches = token_micro_batches(rollout, micro_batch_tokens)
    parts = [policy_forward(model, part, temperature, return_hidden_states, dist=dist)
             for part in batches]
    if dist is not None and dist.enabled:
        for _ in range(max(dist.all_gather_object(len(batches))) - len(batches)):
            policy_forward(model, batches[-1], temperature, return_hidden_states, dist=dist)
    result: dict[str, Any] = {key: torch.cat([part[key] for part in parts])
                              for key in parts[0] if key != "aux_loss"}
    aux = [part["aux_loss"] for part in parts if part.get("aux_loss") is not None]
    result["aux_loss"] = torch.stack(aux).mean() if aux else None
    return result
