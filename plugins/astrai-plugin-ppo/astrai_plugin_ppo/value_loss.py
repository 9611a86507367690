"""The PPO critic's clipped value loss."""

from __future__ import annotations

import torch
from torch import Tensor

from astrai_core.api import aggregate_loss, masked_mean


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float,
    aggregation: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """0.5 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2), aggregated over valid tokens.

    Metrics: value_clip_ratio (fraction of valid tokens with |V - V_old| > eps, measured
    before clipping), value_mean and return_mean.
    """
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}")
    clipped_values = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    per_token = 0.5 * torch.maximum((values - returns).square(),
                                    (clipped_values - returns).square())
    loss = aggregate_loss(per_token, mask, aggregation)
    with torch.no_grad():
        outside = ((values - old_values).abs() > clip_eps).to(per_token.dtype)
        metrics = {
            "value_clip_ratio": masked_mean(outside, mask),
            "value_mean": masked_mean(values.detach(), mask),
            "return_mean": masked_mean(returns.detach(), mask),
        }
    return loss, metrics
