"""Rollout metrics: rewards and lengths, and the sampler/trainer log-prob mismatch."""

from __future__ import annotations

import torch

from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.forward import policy_forward


def rollout_metrics(batch: RolloutBatch, prefix: str = "rollout/") -> dict[str, float]:
    """Reward mean/std (total and per reward), response length and the stopped fraction."""
    lengths = batch.response_lengths().float()
    metrics = {
        f"{prefix}reward_mean": batch.rewards.mean().item(),
        f"{prefix}reward_std": batch.rewards.std(unbiased=False).item(),
        f"{prefix}response_length_mean": lengths.mean().item(),
        f"{prefix}response_length_max": lengths.max().item(),
        f"{prefix}policy_version": float(batch.policy_version),
    }
    if batch.finish_reasons:
        stopped = sum(reason == "stop" for reason in batch.finish_reasons)
        metrics[f"{prefix}stop_fraction"] = stopped / len(batch.finish_reasons)
    for name, values in batch.reward_components.items():
        metrics[f"{prefix}reward/{name}"] = values.float().mean().item()
    return metrics


@torch.no_grad()
def logprob_diff(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> dict[str, float]:
    """Max and mean |sampler log-prob - trainer log-prob| over the valid response tokens
    ({} when the batch carries no sampler log-probs)."""
    if batch.old_logprobs is None:
        return {}
    was_training = model.training
    model.eval()
    try:
        trainer = policy_forward(model, batch, temperature=temperature)["logprobs"]
    finally:
        model.train(was_training)
    diff = (trainer - batch.old_logprobs.to(trainer.device)).abs()[batch.response_mask.to(trainer.device)]
    if diff.numel() == 0:
        return {"rollout/logprob_diff_max": 0.0, "rollout/logprob_diff_mean": 0.0}
    return {"rollout/logprob_diff_max": diff.max().item(), "rollout/logprob_diff_mean": diff.mean().item()}
