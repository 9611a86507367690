"""Rollout metrics: rewards, lengths, episodes (the sampler/trainer log-prob mismatch is
:mod:`astrai_core.online.mismatch`)."""

from __future__ import annotations

from astrai_core.rollout.batch import RolloutBatch


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

