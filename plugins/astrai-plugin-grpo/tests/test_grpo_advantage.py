"""The grpo advantage estimator on hand-computed groups."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from astrai_core.plugins import load_plugins
from astrai_plugin_grpo.advantage import GRPOAdvantage

# Scores are the sums of the token rewards over valid tokens (shaping included):
#   group 0: 1, 0, 0, 1    group 7: 3, 1    group 9: 5 (alone)
# The 9.0 entries sit on padding and must be ignored.
TOKEN_REWARDS = torch.tensor([
    [0.0, 1.0, 9.0],
    [0.0, 0.0, 9.0],
    [-0.5, 0.5, 0.0],
    [0.2, -0.2, 1.0],
    [1.0, 2.0, 9.0],
    [1.0, 9.0, 9.0],
    [5.0, 9.0, 9.0],
])
RESPONSE_MASK = torch.tensor([
    [1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0],
], dtype=torch.bool)
GROUP_IDS = torch.tensor([0, 0, 0, 0, 7, 7, 9])


def _estimate(**params):
    return GRPOAdvantage(**params)(token_rewards=TOKEN_REWARDS, response_mask=RESPONSE_MASK,
                                   group_ids=GROUP_IDS)


def test_std_scaled_group_advantages():
    advantages, returns = _estimate()
    assert returns is None
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.577350 -> +-0.5 / 0.577350
    a0 = 0.5 / math.sqrt(1 / 3)
    # group 7: mean 2, unbiased std sqrt((1 + 1) / 1) = sqrt(2) -> +-1 / sqrt(2)
    a7 = 1 / math.sqrt(2)
    per_sequence = [a0, -a0, -a0, a0, a7, -a7, 0.0]
    expected = torch.tensor(per_sequence)[:, None] * RESPONSE_MASK
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_dr_grpo_scale_none_only_centres():
    advantages, _ = _estimate(scale="none")
    per_sequence = [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0]
    expected = torch.tensor(per_sequence)[:, None] * RESPONSE_MASK
    torch.testing.assert_close(advantages, expected)


def test_equal_scores_and_single_samples_give_zero_not_nan():
    rewards = torch.tensor([[1.0], [1.0], [4.0]])
    advantages, _ = GRPOAdvantage()(token_rewards=rewards, response_mask=torch.ones(3, 1),
                                    group_ids=torch.tensor([2, 2, 5]))
    assert advantages.tolist() == [[0.0], [0.0], [0.0]]


def test_bad_config_names_the_field():
    with pytest.raises(ValidationError, match="scale"):
        GRPOAdvantage(scale="mean")
    with pytest.raises(ValidationError, match="clip"):
        GRPOAdvantage(clip=1.0)


def test_registered_by_name():
    spec = load_plugins().get("advantage_estimator", "grpo")
    estimator_class = spec.load()
    assert estimator_class is GRPOAdvantage
    assert estimator_class.needs_values is False
