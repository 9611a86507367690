"""The trainer-side forward over a rollout: log-probs (and entropy, hidden states) of the
response tokens. Every strategy and the sampler agreement test use this one function."""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.model.head import predicting_positions, target_logprobs
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.packing import packed_forward


def policy_forward(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0,
                   return_hidden_states: bool = False, return_entropy: bool = False) -> dict[str, Any]:
    """One forward over [prompt | response]; values aligned with the response tokens.

    Returns ``logprobs`` [N, R] (log_softmax(logits / temperature) of each response token,
    from the logits at the position BEFORE it), ``entropy`` [N, R] when asked,
    ``hidden_states`` [N, R, H] at those same positions when asked (a value head on them
    gives V(s_t), the value before action t, with no extra shift) and ``aux_loss`` (MoE).
    Padding positions hold finite numbers that callers mask with ``response_mask``.
    A native model computes the log-probs with its chunked head (model/head.py). A
    ``packed`` batch runs as one sequence of its real tokens (rollout/packing.py).
    """
    if batch.packed:
        return packed_forward(model, batch, temperature, return_hidden_states, return_entropy)
    out = target_logprobs(model, batch.input_ids(), batch.response_ids, temperature,
                          with_entropy=return_entropy, attention_mask=batch.attention_mask(),
                          position_ids=batch.position_ids(),
                          return_hidden_states=return_hidden_states)
    result: dict[str, Any] = {"logprobs": out["logprobs"], "aux_loss": out.get("aux_loss")}
    if return_entropy:
        result["entropy"] = out["entropy"]
    if return_hidden_states:
        hidden = out["hidden_states"]
        result["hidden_states"] = hidden[:, predicting_positions(hidden.shape[1],
                                                                 batch.response_ids.shape[1])]
    return result
