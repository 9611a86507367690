"""DPO-family preference losses (sigmoid = DPO, IPO, hinge) on sequence log-probs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from astrai_core.api import masked_sum

DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo", "hinge")


def sequence_logprobs(token_logps: Tensor, response_mask: Tensor) -> Tensor:
    """Log-prob of each response: the sum of its token log-probs over response tokens."""
    return masked_sum(token_logps, response_mask, dim=-1)


def _preference_losses(h: Tensor, beta: float, loss_type: str, label_smoothing: float) -> Tensor:
    """Per-example loss from h = (pi_c - pi_r) - (ref_c - ref_r)."""
    if loss_type == "sigmoid":
        # label_smoothing = the assumed probability that the preference label is flipped.
        return (-(1.0 - label_smoothing) * F.logsigmoid(beta * h)
                - label_smoothing * F.logsigmoid(-beta * h))
    if label_smoothing != 0.0:
        raise ValueError(f"label_smoothing applies to the sigmoid loss only, not {loss_type!r}")
    if loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)).square()
    if loss_type == "hinge":
        return torch.relu(1.0 - beta * h)
    raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of "
                     f"{', '.join(DPO_LOSS_TYPES)}")


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """Per-example preference losses, chosen/rejected implicit rewards and metrics.

    Rewards are beta * (policy - reference) log-probs (detached). Metrics:
    reward_accuracy (fraction with chosen reward > rejected reward) and margin (mean
    chosen - rejected reward).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_log_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_log_ratio = policy_rejected_logps - ref_rejected_logps
    losses = _preference_losses(chosen_log_ratio - rejected_log_ratio, beta, loss_type,
                                label_smoothing)
    chosen_rewards = beta * chosen_log_ratio.detach()
    rejected_rewards = beta * rejected_log_ratio.detach()
    metrics = {
        "reward_accuracy": (chosen_rewards > rejected_rewards).float().mean(),
        "margin": (chosen_rewards - rejected_rewards).mean(),
    }
    return losses, chosen_rewards, rejected_rewards, metrics
