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
    metrics.update(episode_metrics(batch.episode_stats, batch.finish_reasons, prefix))
    return metrics


def episode_metrics(stats: list[dict[str, float]], finish_reasons: list[str],
                    prefix: str = "rollout/") -> dict[str, float]:
    """Multi-turn episodes: turns and tool calls per episode, the tool-error rate (errors per
    call), the environment's seconds (summed over episodes) and the max_turns fraction."""
    if not stats:
        return {}
    total = {key: sum(row[key] for row in stats) for key in stats[0]}
    metrics = {f"{prefix}turns_mean": total["turns"] / len(stats),
               f"{prefix}tool_calls_mean": total["tool_calls"] / len(stats),
               f"{prefix}tool_error_rate": total["tool_errors"] / max(total["tool_calls"], 1.0),
               f"{prefix}env_seconds": total["env_seconds"]}
    if finish_reasons:
        ended = sum(reason == "max_turns" for reason in finish_reasons)
        metrics[f"{prefix}max_turns_fraction"] = ended / len(finish_reasons)
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
