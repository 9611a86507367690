"""The ``grpo`` advantage estimator: rewards normalized within each prompt's group."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from astrai_core.api import AdvantageEstimator, broadcast_to_tokens, group_stats, sequence_scores


class GRPOAdvantage(AdvantageEstimator):
    """A_i = (score_i - mean of its group) / (unbiased std of its group + eps), on every token.

    ``scale: none`` drops the division (Dr. GRPO). The std is torch.std's unbiased one,
    as in TRL's GRPOTrainer. A group of one sample gets advantage 0.
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        scale: Literal["std", "none"] = Field(
            "std", description='"std" divides by the group std; "none" is Dr. GRPO'
        )
        eps: float = Field(1e-6, ge=0.0, description="added to the group std")

    def estimate(self, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None) -> tuple[Tensor, None]:
        scores = sequence_scores(token_rewards.float(), response_mask)
        stats = group_stats(scores, group_ids)
        advantages = scores - stats.mean
        if self.config.scale == "std":
            advantages = advantages / (stats.std + self.config.eps)
        return broadcast_to_tokens(advantages, response_mask), None
