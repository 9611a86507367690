"""SimPO, KTO and ORPO losses: hand-computed values and gradients, and TRL 1.16's own loss
code as an independent reference (CPOTrainer.cpo_loss with loss_type simpo,
ORPOTrainer.odds_ratio_loss, KTOTrainer._compute_loss), called with a stub ``self``."""

from __future__ import annotations

import math
import types
from collections import defaultdict

import pytest
import torch

from astrai_plugin_dpo.losses import kto_kl_estimate, kto_loss, orpo_loss, simpo_loss


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- SimPO

def test_simpo_hand_value_and_gradient():
    # beta 2, gamma 0.5, avg_c -0.5, avg_r -1: logits = 2 * 0.5 - 0.5 = 0.5
    chosen = torch.tensor([-0.5], requires_grad=True)
    rejected = torch.tensor([-1.0], requires_grad=True)
    losses, chosen_rewards, rejected_rewards, metrics = simpo_loss(chosen, rejected, beta=2.0,
                                                                   gamma=0.5)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-0.5)), abs=1e-6)  # 0.474077
    losses.sum().backward()
    # d/d avg_c of -log sigmoid(z) = -beta * sigmoid(-z)
    assert chosen.grad.item() == pytest.approx(-2.0 * _sigmoid(-0.5), abs=1e-6)
    assert rejected.grad.item() == pytest.approx(2.0 * _sigmoid(-0.5), abs=1e-6)
    assert chosen_rewards.item() == pytest.approx(-1.0)  # beta * avg
    assert rejected_rewards.item() == pytest.approx(-2.0)
    assert metrics["margin"].item() == pytest.approx(1.0)
    assert metrics["reward_accuracy"].item() == 1.0


def test_simpo_label_smoothing_mixes_the_flipped_label():
    z = 2.0 * 0.5 - 0.5
    losses, *_ = simpo_loss(torch.tensor([-0.5]), torch.tensor([-1.0]), beta=2.0, gamma=0.5,
                            label_smoothing=0.2)
    expected = -0.8 * math.log(_sigmoid(z)) - 0.2 * math.log(_sigmoid(-z))
    assert losses.item() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- KTO

POLICY = [-3.0, -5.0, -2.0, -4.0]
REFERENCE = [-4.0, -4.0, -3.0, -3.0]      # r = policy - reference = 1, -1, 1, -1
DESIRABLE = [True, False, True, False]


def test_kto_kl_estimate_is_a_clamped_detached_mean():
    policy = torch.tensor([-2.0, -3.0], requires_grad=True)
    kl = kto_kl_estimate(policy, torch.tensor([-2.5, -2.9]))  # (0.5 - 0.1) / 2
    assert kl.item() == pytest.approx(0.2)
    assert not kl.requires_grad
    assert kto_kl_estimate(torch.tensor([-1.0, -1.0]), torch.zeros(2)).item() == 0.0


def test_kto_hand_values_and_gradients():
    beta, z0, w_d, w_u = 0.5, 0.2, 1.5, 0.5
    policy = torch.tensor(POLICY, requires_grad=True)
    losses, rewards, metrics = kto_loss(policy, torch.tensor(REFERENCE), torch.tensor(DESIRABLE),
                                        torch.tensor(z0), beta=beta, desirable_weight=w_d,
                                        undesirable_weight=w_u)
    good = _sigmoid(beta * (1 - z0))          # sigmoid(0.4) = 0.598688
    bad = _sigmoid(beta * (z0 + 1))           # sigmoid(0.6) = 0.645656
    expected = [w_d * (1 - good), w_u * (1 - bad), w_d * (1 - good), w_u * (1 - bad)]
    assert losses.tolist() == pytest.approx(expected, abs=1e-6)
    assert rewards.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])
    assert metrics["chosen_reward"].item() == pytest.approx(0.5)
    assert metrics["rejected_reward"].item() == pytest.approx(-0.5)
    assert metrics["kl"].item() == pytest.approx(z0)
    losses.sum().backward()
    # desirable: d/dr (1 - s(b(r - z0))) = -b s (1 - s); undesirable: +b s (1 - s)
    grad_good = -w_d * beta * good * (1 - good)
    grad_bad = w_u * beta * bad * (1 - bad)
    assert policy.grad.tolist() == pytest.approx([grad_good, grad_bad, grad_good, grad_bad],
                                                 abs=1e-7)


def test_kto_batch_of_one_kind_has_zero_metrics_for_the_other():
    _, _, metrics = kto_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([True]),
                             torch.tensor(0.0), beta=0.1)
    assert metrics["rejected_reward"].item() == 0.0
    assert metrics["desirable_fraction"].item() == 1.0


# ---------------------------------------------------------------- ORPO

def test_orpo_hand_value_and_gradient():
    # p_c = 0.5 -> odds 1 (log 0); p_r = 0.2 -> odds 0.25; log odds ratio = log 4
    chosen = torch.tensor([math.log(0.5)], requires_grad=True)
    rejected = torch.tensor([math.log(0.2)], requires_grad=True)
    losses, metrics = orpo_loss(chosen, rejected, beta=0.1)
    assert metrics["log_odds_ratio"].item() == pytest.approx(math.log(4.0), abs=1e-6)
    # sigmoid(log 4) = 0.8: loss = -0.1 * log 0.8
    assert losses.item() == pytest.approx(-0.1 * math.log(0.8), abs=1e-7)
    losses.sum().backward()
    # d log odds / d avg = 1 / (1 - p); d loss / d log odds ratio = -beta * sigmoid(-L) = -0.02
    assert chosen.grad.item() == pytest.approx(-0.02 / (1 - 0.5), abs=1e-7)
    assert rejected.grad.item() == pytest.approx(0.02 / (1 - 0.2), abs=1e-7)


def test_orpo_is_finite_when_a_response_is_certain():
    # a float32 log-softmax rounds a near-certain token to 0: no inf, no NaN gradient
    chosen = torch.tensor([0.0, -1e-9], requires_grad=True)
    losses, _ = orpo_loss(chosen, torch.tensor([-2.0, -2.0]), beta=0.1)
    losses.sum().backward()
    assert torch.isfinite(losses).all() and torch.isfinite(chosen.grad).all()


# ---------------------------------------------------------------- TRL 1.16 as the reference

CHOSEN_AVG = [-0.3, -1.2, -0.05, -2.0, -0.7]
REJECTED_AVG = [-0.9, -0.4, -1.5, -2.5, -0.7]


def _pair_tensors():
    return (torch.tensor(CHOSEN_AVG, dtype=torch.float64, requires_grad=True),
            torch.tensor(REJECTED_AVG, dtype=torch.float64, requires_grad=True))


def _grads(loss, *leaves):
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.15])
def test_simpo_equals_trl_cpo_simpo_loss(label_smoothing):
    pytest.importorskip("trl")
    from trl.experimental.cpo import CPOTrainer

    beta, gamma = 2.5, 1.375
    stub = types.SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=gamma, beta=beta,
                                 label_smoothing=label_smoothing,
                                 accelerator=types.SimpleNamespace(device="cpu"))
    c, r = _pair_tensors()
    theirs, their_chosen, their_rejected = CPOTrainer.cpo_loss(stub, c, r)
    c2, r2 = _pair_tensors()
    ours, our_chosen, our_rejected, _ = simpo_loss(c2, r2, beta=beta, gamma=gamma,
                                                   label_smoothing=label_smoothing)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(our_chosen, their_chosen)
    torch.testing.assert_close(our_rejected, their_rejected)
    for mine, ref in zip(_grads(ours.mean(), c2, r2), _grads(theirs.mean(), c, r)):
        torch.testing.assert_close(mine, ref)


def test_orpo_equals_trl_odds_ratio_loss():
    pytest.importorskip("trl")
    from trl.experimental.orpo import ORPOTrainer

    beta = 0.25
    stub = types.SimpleNamespace(beta=beta, accelerator=types.SimpleNamespace(device="cpu"))
    c, r = _pair_tensors()
    # TRL returns beta * log sigmoid(log odds ratio) and subtracts its mean from the NLL
    theirs, _, _, their_mean_ratio, their_mean_log_odds = ORPOTrainer.odds_ratio_loss(stub, c, r)
    c2, r2 = _pair_tensors()
    ours, metrics = orpo_loss(c2, r2, beta=beta)
    torch.testing.assert_close(ours, -theirs.to(ours))
    assert metrics["log_odds_ratio"].item() == pytest.approx(their_mean_log_odds.item(), rel=1e-6)
    assert metrics["log_sigmoid_odds_ratio"].item() == pytest.approx(their_mean_ratio.item(),
                                                                     rel=1e-6)
    for mine, ref in zip(_grads(ours.mean(), c2, r2), _grads(-theirs.mean(), c, r)):
        torch.testing.assert_close(mine, ref.to(mine), rtol=1e-5, atol=1e-7)


class _TokenLogprobModel:
    """Stands in for TRL's model: the log-prob of target token v is ``weights[v]`` (and 0
    where the label is -100), so each sequence's log-prob is known and differentiable."""

    training = True

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights

    def __call__(self, *, input_ids, labels, **_kwargs):
        targets = labels[:, 1:]
        logps = torch.where(targets != -100, self.weights[targets.clamp_min(0)], 0.0)
        zeros = torch.zeros_like(logps)
        return types.SimpleNamespace(log_probs=logps, entropy=zeros, mean_logits=zeros)


def _trl_kto_stub(beta: float, w_d: float, w_u: float, model: _TokenLogprobModel):
    from trl import KTOTrainer

    stub = types.SimpleNamespace(
        model=model, beta=beta, loss_type="kto", desirable_weight=w_d, undesirable_weight=w_u,
        calculate_KL=True, precompute_ref_logps=True, aux_loss_enabled=False,
        accelerator=types.SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x),
        _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    stub._compute_kl_logps = types.MethodType(KTOTrainer._compute_kl_logps, stub)
    return stub, KTOTrainer._compute_loss


@pytest.mark.parametrize("kl_sign", [1.0, -1.0])  # a positive KL, and one clamped to 0
def test_kto_equals_trl_kto_trainer_loss(kl_sign):
    pytest.importorskip("trl")
    torch.manual_seed(0)
    beta, w_d, w_u = 0.3, 1.3, 0.7
    vocab = 12
    weights = (-torch.rand(vocab, dtype=torch.float64)).requires_grad_()
    # 4 rows: prompt tokens then completion tokens (completion_mask), right-padded
    input_ids = torch.tensor([[1, 2, 5, 6, 0], [1, 3, 7, 0, 0], [2, 2, 8, 9, 10], [4, 11, 3, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    completion = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    kl_ids = torch.roll(input_ids, 1, 0)  # any mismatched sequences: KTO only needs their logps
    labels = torch.tensor([True, False, False, True])
    ref_logps = torch.tensor([-2.0, -1.1, -2.6, -1.5], dtype=torch.float64)
    model = _TokenLogprobModel(weights)
    with torch.no_grad():
        kl_policy = model(input_ids=kl_ids, labels=kl_ids.masked_fill(completion == 0, -100)
                          ).log_probs.sum(-1)
    ref_kl_logps = kl_policy - kl_sign * torch.tensor([0.3, -0.1, 0.5, 0.2], dtype=torch.float64)
    batch = {"input_ids": input_ids, "attention_mask": attention, "completion_mask": completion,
             "KL_input_ids": kl_ids, "KL_attention_mask": attention,
             "KL_completion_mask": completion, "label": labels, "ref_logps": ref_logps,
             "ref_KL_logps": ref_kl_logps}
    stub, compute_loss = _trl_kto_stub(beta, w_d, w_u, model)
    theirs = compute_loss(stub, model, batch, return_outputs=False)
    their_grad, = torch.autograd.grad(theirs, weights)

    policy = model(input_ids=input_ids, labels=input_ids.masked_fill(completion == 0, -100)
                   ).log_probs.sum(-1)
    kl = kto_kl_estimate(kl_policy, ref_kl_logps)
    assert kl.item() == pytest.approx(max(0.0, kl_sign * 0.225))
    losses, _, _ = kto_loss(policy, ref_logps, labels, kl, beta=beta, desirable_weight=w_d,
                            undesirable_weight=w_u)
    ours = losses.mean()
    our_grad, = torch.autograd.grad(ours, weights)
    # TRL builds some intermediates in float32 (its kl): agreement to float32 precision
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    torch.testing.assert_close(our_grad, their_grad.to(our_grad), rtol=1e-6, atol=1e-8)
    assert stub._metrics["train"]["kl"][-1] == pytest.approx(kl.item())
