"""The clipped value loss on hand-computed tokens."""

from __future__ import annotations

import pytest
import torch

from astrai_plugin_ppo.value_loss import clipped_value_loss

EPS = 0.2
# Row 0, three tokens (V, V_old, R):
#   (1.0, 0.9, 1.5): |V - V_old| = 0.1 <= eps, V unclipped: 0.5 * (1.0 - 1.5)^2 = 0.125
#   (2.0, 1.0, 1.0): clip(V) = 1.2; max((1.0)^2, (0.2)^2) = 1.0 -> 0.5 (outside eps,
#                    but the unclipped term is the larger one)
#   (1.4, 1.0, 1.5): clip(V) = 1.2; max(0.01, 0.09) = 0.09 -> 0.045 (clipped term active)
# Row 1: (3.0, 3.0, 2.0): 0.5 * 1 = 0.5; then two masked tokens holding garbage.
VALUES = [[1.0, 2.0, 1.4], [3.0, 100.0, -100.0]]
OLD_VALUES = [[0.9, 1.0, 1.0], [3.0, 0.0, 0.0]]
RETURNS = [[1.5, 1.0, 1.5], [2.0, 50.0, 50.0]]
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def _loss(aggregation="token-mean", values=VALUES, old_values=OLD_VALUES, returns=RETURNS):
    values = torch.tensor(values, requires_grad=True)
    loss, metrics = clipped_value_loss(values, torch.tensor(old_values), torch.tensor(returns),
                                       MASK, EPS, aggregation)
    return values, loss, metrics


def test_unclipped_case_is_half_mse():
    # V within eps of V_old everywhere: 0.5 * mean((V - R)^2) = 0.5 * (0.25 + 0.04 + 0 + 1) / 4
    values = [[1.0, 1.1, 1.5], [3.0, 0.0, 0.0]]
    old = [[0.9, 1.0, 1.4], [2.9, 0.0, 0.0]]
    returns = [[1.5, 1.3, 1.5], [2.0, 0.0, 0.0]]
    _, loss, metrics = _loss(values=values, old_values=old, returns=returns)
    assert loss.item() == pytest.approx(0.5 * 1.29 / 4, abs=1e-6)
    assert metrics["value_clip_ratio"].item() == 0.0


def test_clipped_case_token_mean_and_metrics():
    _, loss, metrics = _loss()
    assert loss.item() == pytest.approx((0.125 + 0.5 + 0.045 + 0.5) / 4, abs=1e-6)
    # |V - V_old| > 0.2 at tokens 1 (1.0) and 2 (0.4) of the 4 valid ones
    assert metrics["value_clip_ratio"].item() == pytest.approx(0.5)
    assert metrics["value_mean"].item() == pytest.approx((1.0 + 2.0 + 1.4 + 3.0) / 4)
    assert metrics["return_mean"].item() == pytest.approx((1.5 + 1.0 + 1.5 + 2.0) / 4)


def test_seq_mean_token_mean_aggregation():
    _, loss, _ = _loss("seq-mean-token-mean")
    assert loss.item() == pytest.approx(((0.125 + 0.5 + 0.045) / 3 + 0.5) / 2, abs=1e-6)


def test_gradient_is_zero_where_clipped_or_masked():
    values, loss, _ = _loss()
    loss.backward()
    # d/dV of 0.5 (V - R)^2 / 4 = (V - R) / 4 where the unclipped term is active
    expected = [[-0.5 / 4, 1.0 / 4, 0.0], [1.0 / 4, 0.0, 0.0]]
    torch.testing.assert_close(values.grad, torch.tensor(expected))
