"""Independent references for rollout log-probs: one unpadded float64 forward per row."""

from __future__ import annotations

from typing import Any


def reference_log_softmax(model: Any, batch: Any, temperature: float = 1.0) -> list[Any]:
    """An independent reference for rollout log-probs: for each row of a ``RolloutBatch``,
    float64 ``log_softmax(logits / temperature)`` [response length, vocab] at the positions
    predicting its response tokens, from one unpadded forward of just that row's
    prompt + response (no masks, positions or batching involved)."""
    import torch

    rows = []
    with torch.no_grad():
        for i in range(len(batch.response_ids)):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
            response = batch.response_ids[i][batch.response_mask[i].bool()].tolist()
            logits = model(torch.tensor([prompt + response]))["logits"][0].double()
            rows.append(torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, dim=-1))
    return rows


def reference_token_logprobs(model: Any, batch: Any, temperature: float = 1.0) -> list[Any]:
    """Per row, the float64 log-prob of each valid response token (see
    :func:`reference_log_softmax`)."""
    logps = reference_log_softmax(model, batch, temperature)
    return [logp.gather(-1, batch.response_ids[i][batch.response_mask[i].bool()][:, None])
            .squeeze(-1) for i, logp in enumerate(logps)]
