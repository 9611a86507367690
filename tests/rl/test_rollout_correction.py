"""Rollout-correction weights, masks and metrics on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from astrai_core.rl.rollout_correction import RolloutCorrectionConfig, correction_weights

# Row 0: 3 tokens with trainer - sampler log-gaps 1.0, -0.2, 0.0; row 1: 1 token, gap -1.5.
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5, -7.0], [-0.5, -3.0, -3.0, -3.0]])
GAPS = torch.tensor([[1.0, -0.2, 0.0, 5.0], [-1.5, 9.0, 9.0, 9.0]])  # padding: garbage
TRAINER = SAMPLER + GAPS
MASK = torch.tensor([[True, True, True, False], [True, False, False, False]])
TOKEN_W = [math.exp(1.0), math.exp(-0.2), 1.0, math.exp(-1.5)]   # 2.718, 0.819, 1, 0.223


def _weights(**options):
    return correction_weights(TRAINER, SAMPLER, MASK, RolloutCorrectionConfig(**options))


def _k3(gaps):
    return sum(math.exp(g) - 1 - g for g in gaps) / len(gaps)


def test_token_truncate_caps_at_the_threshold():
    weights, metrics = _weights(level="token", mode="truncate", threshold=2.0)
    assert weights[0].tolist() == pytest.approx([2.0, TOKEN_W[1], 1.0, 0.0])
    assert weights[1].tolist() == pytest.approx([TOKEN_W[3], 0.0, 0.0, 0.0])
    assert metrics["weight_mean"].item() == pytest.approx(sum(TOKEN_W) / 4)
    assert metrics["weight_max"].item() == pytest.approx(math.e)
    assert metrics["truncated_fraction"].item() == pytest.approx(0.25)
    assert metrics["kl"].item() == pytest.approx(_k3([1.0, -0.2, 0.0, -1.5]))


def test_token_mask_drops_tokens_outside_the_range():
    weights, metrics = _weights(level="token", mode="mask", threshold=2.0)
    # kept: [1/2, 2] holds 0.819 and 1; 2.718 and 0.223 are dropped
    assert weights[0].tolist() == pytest.approx([0.0, TOKEN_W[1], 1.0, 0.0])
    assert weights[1].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0])
    assert metrics["masked_fraction"].item() == pytest.approx(0.5)
    assert "truncated_fraction" not in metrics


def test_sequence_level_uses_the_geometric_mean_of_each_sequence():
    seq0, seq1 = math.exp((1.0 - 0.2 + 0.0) / 3), math.exp(-1.5)   # 1.306, 0.223
    weights, metrics = _weights(level="sequence", mode="truncate", threshold=1.2)
    assert weights[0].tolist() == pytest.approx([1.2, 1.2, 1.2, 0.0])
    assert weights[1].tolist() == pytest.approx([seq1, 0.0, 0.0, 0.0])
    assert metrics["weight_mean"].item() == pytest.approx((seq0 + seq1) / 2)
    assert metrics["weight_max"].item() == pytest.approx(seq0)
    assert metrics["truncated_fraction"].item() == pytest.approx(0.5)
    weights, metrics = _weights(level="sequence", mode="mask", threshold=1.5)
    # [1/1.5, 1.5] keeps sequence 0 whole, drops sequence 1 whole
    assert weights[0].tolist() == pytest.approx([seq0, seq0, seq0, 0.0])
    assert weights[1].tolist() == pytest.approx([0.0] * 4)
    assert metrics["masked_fraction"].item() == pytest.approx(0.5)


def test_agreeing_log_probs_give_weight_one_and_no_kl():
    weights, metrics = correction_weights(SAMPLER, SAMPLER, MASK, RolloutCorrectionConfig())
    assert weights[MASK].tolist() == [1.0] * 4 and weights[~MASK].abs().sum() == 0
    assert metrics["kl"].item() == 0.0 and metrics["truncated_fraction"].item() == 0.0


def test_options_are_validated():
    assert RolloutCorrectionConfig().model_dump() == {
        "level": "token", "mode": "truncate", "threshold": 2.0}
    with pytest.raises(ValidationError, match="greater than 1"):
        RolloutCorrectionConfig(threshold=1.0)
    with pytest.raises(ValidationError, match="'token' or 'sequence'"):
        RolloutCorrectionConfig(level="batch")
