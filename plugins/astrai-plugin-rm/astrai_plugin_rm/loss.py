"""The Bradley-Terry reward-model loss on the scalar rewards of preference pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def bradley_terry_loss(chosen: Tensor, rejected: Tensor, margin: Tensor | None = None,
                       center_rewards_coefficient: float | None = None
                       ) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean over pairs of ``-log sigmoid(r_chosen - r_rejected - margin)``, plus
    ``center_rewards_coefficient * mean((r_chosen + r_rejected)^2)`` when set.

    The margin asks the model for at least that reward gap (Llama 2's margin loss); the
    centring term pulls the rewards towards zero mean, so that their scale stays
    comparable between models (the two terms as in TRL's reward trainer).
    Returns the loss and detached metrics: ``accuracy`` (share of pairs with
    r_chosen > r_rejected; a tie counts as wrong), the mean rewards and their gap.
    """
    gap = chosen - rejected
    loss = -F.logsigmoid(gap if margin is None else gap - margin).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (chosen + rejected).square().mean()
    with torch.no_grad():
        metrics = {"accuracy": (gap > 0).float().mean(), "chosen_reward": chosen.mean(),
                   "rejected_reward": rejected.mean(), "reward_gap": gap.mean()}
    return loss, metrics
