"""The distillation losses: hand-computed values and gradients, and TRL's GKD loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from astrai_plugin_distill.losses import (forward_kl, generalized_jsd, reverse_kl,
                                          sampled_reverse_kl, token_loss)

# Two tokens: p_s = (1/2, 1/2), p_t = (3/4, 1/4).
STUDENT = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
TEACHER = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)
P_S, P_T = (0.5, 0.5), (0.75, 0.25)


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def _grad(loss_fn, student=STUDENT, teacher=TEACHER):
    student = student.clone().requires_grad_(True)
    value = loss_fn(student, teacher)
    value.sum().backward()
    return value.detach(), student.grad


def test_reverse_kl_by_hand():
    value, grad = _grad(reverse_kl)
    assert value.item() == pytest.approx(_kl(P_S, P_T))
    # d KL(p_s || p_t) / dz_i = p_s,i (log p_s,i - log p_t,i - KL)
    kl = _kl(P_S, P_T)
    expected = [s * (math.log(s / t) - kl) for s, t in zip(P_S, P_T)]
    assert grad[0].tolist() == pytest.approx(expected)


def test_forward_kl_by_hand():
    value, grad = _grad(forward_kl)
    assert value.item() == pytest.approx(_kl(P_T, P_S))
    assert grad[0].tolist() == pytest.approx([s - t for s, t in zip(P_S, P_T)])  # p_s - p_t


def test_temperature_softens_both_and_scales_the_gradient():
    value, grad = _grad(lambda s, t: forward_kl(s, t, temperature=2.0))
    p_t = F.softmax(TEACHER / 2, -1)[0].tolist()  # (sqrt 3, 1) / (sqrt 3 + 1)
    assert p_t[0] == pytest.approx(math.sqrt(3) / (math.sqrt(3) + 1))
    assert value.item() == pytest.approx(_kl(p_t, P_S))
    assert grad[0].tolist() == pytest.approx([(s - t) / 2 for s, t in zip(P_S, p_t)])


def test_forward_kl_top_k_renormalises_over_the_teachers_top_tokens():
    student = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)
    teacher = torch.tensor([[math.log(6.0), math.log(3.0), 0.0]], dtype=torch.float64)
    value, grad = _grad(lambda s, t: forward_kl(s, t, top_k=2), student, teacher)
    p_t = (6 / 9, 3 / 9)                                 # tokens 0 and 1, renormalised
    p_s = (1 / (1 + math.e), math.e / (1 + math.e))
    assert value.item() == pytest.approx(_kl(p_t, p_s))
    assert grad[0].tolist() == pytest.approx([p_s[0] - p_t[0], p_s[1] - p_t[1], 0.0])
    full = forward_kl(student, teacher, top_k=3)        # k = V: the exact forward KL
    assert full.item() == pytest.approx(forward_kl(student, teacher).item())


# beta -> (the mixture m = beta p_t + (1 - beta) p_s, beta KL(p_t || m) + (1 - beta) KL(p_s || m))
# by hand; an asymmetric beta, so that swapping the mixture's weights changes the value
# (at 0.5 it would not: 0.0338 either way)
JSD_BY_HAND = {
    0.1: ((0.525, 0.475), 0.1 * (0.75 * math.log(0.75 / 0.525) + 0.25 * math.log(0.25 / 0.475))
          + 0.9 * (0.5 * math.log(0.5 / 0.525) + 0.5 * math.log(0.5 / 0.475))),   # 0.011831
    0.3: ((0.575, 0.425), 0.3 * (0.75 * math.log(0.75 / 0.575) + 0.25 * math.log(0.25 / 0.425))
          + 0.7 * (0.5 * math.log(0.5 / 0.575) + 0.5 * math.log(0.5 / 0.425))),   # 0.027951
}


@pytest.mark.parametrize("beta", sorted(JSD_BY_HAND))
def test_jsd_by_hand_and_its_limits(beta):
    mixture, by_hand = JSD_BY_HAND[beta]
    assert mixture == pytest.approx([beta * t + (1 - beta) * s for s, t in zip(P_S, P_T)])
    assert by_hand == pytest.approx({0.1: 0.0118306822, 0.3: 0.0279510390}[beta], abs=1e-10)
    value, grad = _grad(lambda s, t: generalized_jsd(s, t, beta))
    assert value.item() == pytest.approx(by_hand, rel=1e-12)
    numeric = []  # central differences on the student's logits
    for i in range(2):
        step = torch.zeros_like(STUDENT)
        step[0, i] = 1e-6
        up = generalized_jsd(STUDENT + step, TEACHER, beta).item()
        down = generalized_jsd(STUDENT - step, TEACHER, beta).item()
        numeric.append((up - down) / 2e-6)
    assert grad[0].tolist() == pytest.approx(numeric, abs=1e-8)
    assert generalized_jsd(STUDENT, TEACHER, 0.0).item() == pytest.approx(_kl(P_T, P_S))
    assert generalized_jsd(STUDENT, TEACHER, 1.0).item() == pytest.approx(_kl(P_S, P_T))
    # near the limits the mixture formula meets the KLs
    assert generalized_jsd(STUDENT, TEACHER, 1e-9).item() == pytest.approx(0.0, abs=1e-8)


def test_sampled_reverse_kl_value_and_score_function_gradient():
    targets = torch.tensor([1])
    value, grad = _grad(lambda s, t: sampled_reverse_kl(s, t, targets))
    estimate = math.log(P_S[1] / P_T[1])                 # log p_s(y) - log p_t(y)
    assert value.item() == pytest.approx(estimate)
    # gradient: estimate * d log p_s(y) / dz = estimate * (onehot(y) - p_s)
    assert grad[0].tolist() == pytest.approx([estimate * (0 - P_S[0]), estimate * (1 - P_S[1])])
    # on samples from p_s its expectation is the exact reverse KL
    exact = sum(p * math.log(p / t) for p, t in zip(P_S, P_T))
    assert exact == pytest.approx(reverse_kl(STUDENT, TEACHER).item())


def test_token_loss_selects_by_config():
    targets = torch.tensor([0])
    for name, kwargs, expected in [
        ("reverse_kl", {}, reverse_kl(STUDENT, TEACHER)),
        ("forward_kl", {"top_k": 1}, torch.zeros(1)),   # one token: both renormalise to 1
        ("jsd", {"beta": 0.3}, generalized_jsd(STUDENT, TEACHER, 0.3)),
        ("reverse_kl", {"estimator": "sampled"}, sampled_reverse_kl(STUDENT, TEACHER, targets)),
    ]:
        got = token_loss(name, **kwargs)(STUDENT, TEACHER, targets)
        assert got.tolist() == pytest.approx(expected.tolist())


# -- TRL's GKDTrainer.generalized_jsd_loss as the reference ---------------------------------

@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_matches_trl_generalized_jsd_loss(beta, temperature):
    trl = pytest.importorskip("trl", reason="TRL is the reference: pip install -r "
                              "bench/requirements.txt")
    from trl.experimental.gkd import GKDTrainer  # noqa: F401  (1.16's location)
    torch.manual_seed(0)
    student = (3 * torch.randn(3, 5, 11, dtype=torch.float64)).requires_grad_(True)
    teacher = 3 * torch.randn(3, 5, 11, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 5))
    labels[0, :2] = labels[2, 4] = -100                  # prompt / padding positions
    mask = labels != -100
    expected = _trl_loss()(student, teacher, labels=labels, beta=beta, temperature=temperature)
    expected_grad, = torch.autograd.grad(expected, student)
    ours = generalized_jsd(student[mask], teacher[mask], beta, temperature).mean()
    grad, = torch.autograd.grad(ours, student)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-12)
    del trl


def _trl_loss():
    try:
        from trl.experimental.gkd import GKDTrainer
    except ImportError:  # older layouts
        from trl import GKDTrainer
    return GKDTrainer.generalized_jsd_loss
