"""RLOO (REINFORCE Leave-One-Out, Ahmadian et al. 2024) advantage estimator."""

from __future__ import annotations

import torch
from torch import Tensor

from astrai_core.api import AdvantageEstimator, broadcast_to_tokens, group_stats, sequence_scores


class RLOOAdvantage(AdvantageEstimator):
    """A_i = score_i - mean of the OTHER scores in i's group, on every valid token.

    score_i is the sum of the sequence's token rewards. A group of one sample has
    no baseline to compare with and gets advantage 0.
    """

    # no options (yet): AdvantageEstimator's empty Config

    def estimate(self, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None) -> tuple[Tensor, None]:
        scores = sequence_scores(token_rewards.float(), response_mask)
        stats = group_stats(scores, group_ids)
        others = stats.count - 1
        baseline = (stats.sum - scores) / others.clamp_min(1)
        advantages = torch.where(others > 0, scores - baseline, 0.0)
        return broadcast_to_tokens(advantages, response_mask), None
