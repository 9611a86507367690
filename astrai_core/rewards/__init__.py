"""Reward functions (TRL convention) and the weighted set a run applies; see reward_set.py."""

from astrai_core.rewards.builtin import FormatRegex, LengthPenalty, exact_match, final_number
from astrai_core.rewards.reward_set import (
    RewardError,
    RewardSet,
    RewardTerm,
    build_reward,
)

__all__ = ["FormatRegex", "LengthPenalty", "RewardError", "RewardSet", "RewardTerm", "build_reward",
           "exact_match", "final_number"]
