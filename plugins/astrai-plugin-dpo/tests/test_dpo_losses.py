"""DPO-family losses against a direct evaluation of their formulas on floats."""

from __future__ import annotations

import math

import pytest
import torch

from astrai_plugin_dpo.losses import dpo_loss, sequence_logprobs

BETA = 0.1
# (policy chosen, policy rejected, ref chosen, ref rejected)
EXAMPLES = [(-5.0, -7.0, -6.0, -6.5), (-8.0, -6.0, -7.0, -7.0)]
# h = (pc - pr) - (rc - rr): example 0: 2 - 0.5 = 1.5; example 1: -2 - 0 = -2


def _h(pc, pr, rc, rr):
    return (pc - pr) - (rc - rr)


def _log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def _run(loss_type, label_smoothing=0.0):
    columns = [torch.tensor(column) for column in zip(*EXAMPLES)]
    return dpo_loss(*columns, beta=BETA, loss_type=loss_type, label_smoothing=label_smoothing)


@pytest.mark.parametrize("loss_type, label_smoothing, formula", [
    ("sigmoid", 0.0, lambda h: -_log_sigmoid(BETA * h)),
    ("sigmoid", 0.1, lambda h: -0.9 * _log_sigmoid(BETA * h) - 0.1 * _log_sigmoid(-BETA * h)),
    ("ipo", 0.0, lambda h: (h - 1 / (2 * BETA)) ** 2),
    ("hinge", 0.0, lambda h: max(0.0, 1 - BETA * h)),
])
def test_loss_matches_formula(loss_type, label_smoothing, formula):
    losses, _, _, _ = _run(loss_type, label_smoothing)
    expected = [formula(_h(*example)) for example in EXAMPLES]
    assert losses.tolist() == pytest.approx(expected, abs=1e-6)


def test_hand_numbers_for_ipo_and_hinge():
    # ipo: (1.5 - 5)^2 = 12.25, (-2 - 5)^2 = 49; hinge: 1 - 0.15 = 0.85, 1 + 0.2 = 1.2
    assert _run("ipo")[0].tolist() == pytest.approx([12.25, 49.0])
    assert _run("hinge")[0].tolist() == pytest.approx([0.85, 1.2])


def test_rewards_and_metrics():
    _, chosen, rejected, metrics = _run("sigmoid")
    # chosen = 0.1 * (pc - rc) = 0.1, -0.1; rejected = 0.1 * (pr - rr) = -0.05, 0.1
    assert chosen.tolist() == pytest.approx([0.1, -0.1])
    assert rejected.tolist() == pytest.approx([-0.05, 0.1])
    assert metrics["reward_accuracy"].item() == pytest.approx(0.5)
    assert metrics["margin"].item() == pytest.approx((0.15 + -0.2) / 2)


def test_sigmoid_gradient_matches_formula():
    # d/d pc of -log sigmoid(beta h) = -beta * sigmoid(-beta h)
    pc = torch.tensor([-5.0], requires_grad=True)
    losses, _, _, _ = dpo_loss(pc, torch.tensor([-7.0]), torch.tensor([-6.0]),
                               torch.tensor([-6.5]), beta=BETA)
    losses.sum().backward()
    expected = -BETA / (1 + math.exp(BETA * 1.5))
    assert pc.grad.item() == pytest.approx(expected, abs=1e-7)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="loss_type 'kto'"):
        _run("kto")
    with pytest.raises(ValueError, match="sigmoid loss only"):
        _run("ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(*[torch.zeros(1)] * 4, beta=0.0)


def test_sequence_logprobs_sum_response_tokens_only():
    token_logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 9.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert sequence_logprobs(token_logps, mask).tolist() == [-6.0, -0.5]
