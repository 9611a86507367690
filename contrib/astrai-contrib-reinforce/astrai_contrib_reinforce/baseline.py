"""The mean baseline of REINFORCE (Williams, 1992): A_i = s_i - b, b a mean of scores."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from astrai_core.api import AdvantageEstimator, broadcast_to_tokens, group_stats, sequence_scores


class MeanBaseline(AdvantageEstimator):
    """A_i = s_i - b on every valid token of sample i, where s_i is the sum of its token
    rewards and b the mean score of its group (``baseline: group``, the samples of one
    prompt, i included), of the whole rollout (``batch``) or 0 (``none``: plain
    REINFORCE, unbiased but noisy). Advantages are not divided by a standard deviation:
    that is GRPO's estimator, not REINFORCE's.
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

        baseline: Literal["group", "batch", "none"] = Field(
            "group", description="the mean subtracted from each score: of the sample's "
            "group (its prompt's samples), of the whole rollout, or none")

    def estimate(self, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None) -> tuple[Tensor, None]:
        scores = sequence_scores(token_rewards.float(), response_mask)
        if self.config.baseline == "group":
            baseline = group_stats(scores, group_ids).mean
        elif self.config.baseline == "batch":
            baseline = scores.mean().expand_as(scores)
        else:
            baseline = torch.zeros_like(scores)
        return broadcast_to_tokens(scores - baseline, response_mask), None
