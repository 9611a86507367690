"""The Bradley-Terry loss: values and gradients by hand, and against TRL's reward trainer."""

from __future__ import annotations

import math

import pytest
import torch

from astrai_plugin_rm.loss import bradley_terry_loss


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _pair(chosen, rejected):
    return (torch.tensor(chosen, dtype=torch.float64, requires_grad=True),
            torch.tensor(rejected, dtype=torch.float64, requires_grad=True))


def test_values_and_gradients_by_hand():
    chosen, rejected = _pair([2.0, 0.0, 0.5], [1.0, 1.0, 0.5])
    loss, metrics = bradley_terry_loss(chosen, rejected)
    # -log sigmoid(g) = softplus(-g), gaps 1, -1, 0
    assert loss.item() == pytest.approx((_softplus(-1) + _softplus(1) + math.log(2)) / 3, rel=1e-12)
    loss.backward()
    # d/dr_c softplus(-(c - r)) / N = -sigmoid(-(c - r)) / N, and the opposite for r
    expected = [-_sigmoid(-g) / 3 for g in (1.0, -1.0, 0.0)]
    assert chosen.grad.tolist() == pytest.approx(expected, rel=1e-12)
    assert rejected.grad.tolist() == pytest.approx([-e for e in expected], rel=1e-12)
    assert metrics["accuracy"].item() == pytest.approx(1 / 3)  # a tie is not ranked right
    assert metrics["reward_gap"].item() == pytest.approx(0.0)


def test_margin_and_centring_by_hand():
    chosen, rejected = _pair([2.0, -1.0], [1.0, -3.0])
    margin = torch.tensor([0.5, 3.0], dtype=torch.float64)
    loss, _ = bradley_terry_loss(chosen, rejected, margin, center_rewards_coefficient=0.1)
    gaps = [2.0 - 1.0 - 0.5, -1.0 + 3.0 - 3.0]  # 0.5, -1
    sums = [3.0, -4.0]
    expected = sum(_softplus(-g) for g in gaps) / 2 + 0.1 * sum(s * s for s in sums) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    # d/dr_c: -sigmoid(-gap) / N + 0.1 * 2 * (c + r) / N
    grad_c = [-_sigmoid(-g) / 2 + 0.1 * 2 * s / 2 for g, s in zip(gaps, sums)]
    grad_r = [_sigmoid(-g) / 2 + 0.1 * 2 * s / 2 for g, s in zip(gaps, sums)]
    assert chosen.grad.tolist() == pytest.approx(grad_c, rel=1e-12)
    assert rejected.grad.tolist() == pytest.approx(grad_r, rel=1e-12)


def test_large_gaps_stay_finite():
    chosen, rejected = _pair([500.0, -500.0], [-500.0, 500.0])
    loss, _ = bradley_terry_loss(chosen, rejected)
    assert loss.item() == pytest.approx(1000.0 / 2)  # softplus(-1000) ~ 0, softplus(1000) = 1000
    loss.backward()
    assert torch.isfinite(chosen.grad).all()


class _Identity:
    """Stand-ins for what TRL's compute_loss touches besides the rewards (one process)."""

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather


def _trl_loss(chosen, rejected, margin, center):
    """TRL 1.16 RewardTrainer.compute_loss on these rewards: its model returns them as
    the logits of the chosen rows followed by the rejected rows."""
    from collections import defaultdict
    from types import SimpleNamespace

    trl = pytest.importorskip("trl", minversion="1.16")
    from trl.trainer.reward_trainer import RewardTrainer

    def model(**inputs):
        return SimpleNamespace(logits=torch.cat([chosen, rejected])[:, None])

    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_Identity(),
        args=SimpleNamespace(center_rewards_coefficient=center),
        _total_train_tokens=0, _tp_size=1,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    inputs = {"input_ids": torch.zeros(2 * len(chosen), 3, dtype=torch.long),
              "attention_mask": torch.ones(2 * len(chosen), 3, dtype=torch.long)}
    if margin is not None:
        inputs["margin"] = margin
    assert trl.__version__.startswith("1.16")
    loss = RewardTrainer.compute_loss(stub, model, inputs)
    return loss, stub._metrics["train"]


@pytest.mark.parametrize("with_margin", [False, True])
@pytest.mark.parametrize("center", [None, 0.01])
def test_equals_trl_reward_trainer_loss(with_margin, center):
    torch.manual_seed(0)
    values = torch.randn(2, 16, dtype=torch.float64) * 2
    margin = torch.rand(16, dtype=torch.float64) if with_margin else None
    chosen, rejected = values[0].clone().requires_grad_(), values[1].clone().requires_grad_()
    ref_c, ref_r = values[0].clone().requires_grad_(), values[1].clone().requires_grad_()
    loss, metrics = bradley_terry_loss(chosen, rejected, margin, center)
    reference, ref_metrics = _trl_loss(ref_c, ref_r, margin, center)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-12)
    loss.backward()
    reference.backward()
    torch.testing.assert_close(chosen.grad, ref_c.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(rejected.grad, ref_r.grad, rtol=1e-12, atol=1e-14)
    assert metrics["accuracy"].item() == pytest.approx(ref_metrics["accuracy"][0])
    assert metrics["reward_gap"].item() == pytest.approx(ref_metrics["margin"][0])
