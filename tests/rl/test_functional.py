"""astrai_core.rl.functional on hand-computed cases (expected numbers derived in comments)."""

from __future__ import annotations

import math

import pytest
import torch

from astrai_core.model import head
from astrai_core.rl import functional as F

NAN = float("nan")


def approx(values, **kw):
    return pytest.approx(values, abs=kw.pop("abs", 1e-6), **kw)


# ---------------------------------------------------------------- masked statistics

# Valid entries 1, 2, 3, 4, 5 (the masked one holds NaN and must not matter):
# sum 15, mean 3, squared deviations 4+1+0+1+4 = 10 -> unbiased var 10/4, biased 10/5.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, NAN]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_masked_sum_mean_var_over_everything():
    assert F.masked_sum(VALUES, MASK).item() == 15.0
    assert F.masked_mean(VALUES, MASK).item() == 3.0
    assert F.masked_var(VALUES, MASK).item() == approx(2.5)
    assert F.masked_var(VALUES, MASK, unbiased=False).item() == approx(2.0)


def test_masked_statistics_along_a_dim():
    # row 0: 1,2,3 -> mean 2, unbiased var (1+0+1)/2 = 1; row 1: 4,5 -> mean 4.5, var 0.5
    assert F.masked_mean(VALUES, MASK, dim=-1).tolist() == [2.0, 4.5]
    assert F.masked_var(VALUES, MASK, dim=-1).tolist() == approx([1.0, 0.5])


def test_masked_statistics_of_nothing_are_zero_not_nan():
    empty = torch.zeros_like(MASK)
    assert F.masked_mean(VALUES, empty).item() == 0.0
    assert F.masked_var(VALUES, empty).item() == 0.0
    # a single valid entry has no unbiased variance: 0, not NaN
    one = torch.tensor([[True, False, False], [False, False, False]])
    assert F.masked_var(VALUES, one).item() == 0.0


def test_masked_whiten_hand_values():
    # (v - 3) / sqrt(2.5): -2/1.58114 = -1.26491, -1/1.58114 = -0.63246, 0, ...
    expected = [[-1.264911, -0.632456, 0.0], [0.632456, 1.264911, 0.0]]
    whitened = F.masked_whiten(VALUES, MASK)
    assert whitened.tolist() == [approx(row) for row in expected]
    valid = whitened[MASK]
    assert valid.mean().item() == approx(0.0)
    assert valid.std().item() == approx(1.0, abs=1e-5)
    # shift_mean=False keeps the mean (3) and only rescales
    kept = F.masked_whiten(VALUES, MASK, shift_mean=False)
    assert kept[0].tolist() == approx([3 - 1.264911, 3 - 0.632456, 3.0])
    assert kept[1, 2].item() == 0.0


# ---------------------------------------------------------------- log-probs, entropy

def test_token_logprobs_hand_case_with_temperature():
    # logits = log(1, 2, 3): probs 1/6, 2/6, 3/6. At temperature 0.5 the logits double:
    # log(1, 4, 9) -> probs 1/14, 4/14, 9/14.
    logits = torch.log(torch.tensor([[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]]))
    targets = torch.tensor([[2, 1]])
    assert F.token_logprobs(logits, targets).tolist() == [approx([math.log(3 / 6),
                                                                   math.log(2 / 6)])]
    cooled = F.token_logprobs(logits, targets, temperature=0.5)
    assert cooled.tolist() == [approx([math.log(9 / 14), math.log(4 / 14)])]


def test_token_logprobs_matches_log_softmax_gather_and_its_gradient(monkeypatch):
    monkeypatch.setattr(head, "_LOGIT_ROWS_PER_CHUNK", 4)  # 2*5 = 10 rows -> 3 chunks
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    ours = F.token_logprobs(logits, targets, temperature=0.7)
    ours.sum().backward()
    ours_grad = logits.grad.clone()
    logits.grad = None
    reference = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    reference.sum().backward()
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, logits.grad)


def test_token_logprobs_of_bf16_logits_are_float32():
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 9).to(torch.bfloat16)
    targets = torch.randint(0, 9, (3, 4))
    ours = F.token_logprobs(logits, targets)
    assert ours.dtype == torch.float32
    reference = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(ours, reference)


def test_entropy_from_logits_hand_case():
    # probs 1/6, 1/3, 1/2: H = -(1/6 ln 1/6 + 1/3 ln 1/3 + 1/2 ln 1/2) = 1.011404
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]))
    expected_first = -sum(p * math.log(p) for p in (1 / 6, 1 / 3, 1 / 2))
    assert expected_first == approx(1.011404)
    # the uniform row has H = ln 3 at any temperature
    assert F.entropy_from_logits(logits).tolist() == approx([expected_first, math.log(3)])
    # temperature 0.5 -> probs 1/14, 4/14, 9/14
    cooled = -sum(p * math.log(p) for p in (1 / 14, 4 / 14, 9 / 14))
    assert F.entropy_from_logits(logits, 0.5).tolist() == approx([cooled, math.log(3)])


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature"):
        F.token_logprobs(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), 0.0)


# ---------------------------------------------------------------- KL estimators

def test_kl_estimators_on_numbers():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    # log ratios logp - ref = 0.5, -1.0
    assert F.kl_estimate(logp, ref, "k1").tolist() == approx([0.5, -1.0])
    # k2 = 0.5 * 0.25 = 0.125; 0.5 * 1 = 0.5
    assert F.kl_estimate(logp, ref, "k2").tolist() == approx([0.125, 0.5])
    # k3 = exp(ref - logp) - (ref - logp) - 1: e^-0.5 + 0.5 - 1 = 0.1065307; e^1 - 1 - 1 = 0.7182818
    assert F.kl_estimate(logp, ref, "k3").tolist() == approx([0.1065307, 0.7182818])


def test_unknown_kl_estimator_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'k4'.*k1, k2, k3"):
        F.kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


# ---------------------------------------------------------------- loss aggregation

# Row lengths 4, 2 and 0; masked entries hold garbage (99) that must not count.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 99.0, 99.0], [99.0] * 4])
LOSS_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize("mode, norm_length, expected", [
    ("token-mean", None, 40 / 6),              # (1+2+3+4+10+20) / 6 tokens
    ("seq-mean-token-mean", None, 8.75),       # mean(2.5, 15); the empty row is not a sequence
    ("seq-mean-token-sum", None, 20.0),        # mean(10, 30)
    ("seq-mean-token-sum-norm", None, 40 / 12),  # 40 / (N=3 * T=4)
    ("seq-mean-token-sum-norm", 8, 40 / 24),   # 40 / (3 * 8)
])
def test_aggregation_modes(mode, norm_length, expected):
    assert F.aggregate_loss(LOSS, LOSS_MASK, mode, norm_length).item() == approx(expected)


@pytest.mark.parametrize("mode", F.AGGREGATION_MODES)
def test_aggregation_of_no_tokens_is_zero_with_zero_gradient(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    result = F.aggregate_loss(loss, torch.zeros(2, 3, dtype=torch.bool), mode)
    result.backward()
    assert result.item() == 0.0
    assert loss.grad.abs().sum().item() == 0.0


def test_aggregation_gradient_skips_masked_tokens():
    loss = LOSS.clone().requires_grad_(True)
    F.aggregate_loss(loss, LOSS_MASK, "seq-mean-token-mean").backward()
    # each row's tokens weigh 1 / (2 sequences * row length)
    expected = [[1 / 8] * 4, [1 / 4, 1 / 4, 0.0, 0.0], [0.0] * 4]
    assert loss.grad.tolist() == [approx(row) for row in expected]


def test_unknown_aggregation_is_a_clear_error():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        F.aggregate_loss(LOSS, LOSS_MASK, "mean")


# ---------------------------------------------------------------- clipped policy loss

def test_clipped_policy_loss_both_sides_of_the_clip():
    eps_low, eps_high = 0.2, 0.3  # r clipped to [0.8, 1.3]
    ratio = torch.tensor([[1.5, 0.5, 1.1], [0.5, 1.5, 5.0]])
    advantages = torch.tensor([[1.0, 1.0, 2.0], [-1.0, -1.0, 1.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    old_logp = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]])
    logp = (old_logp + ratio.log()).requires_grad_(True)
    loss, metrics = F.clipped_policy_loss(logp, old_logp, advantages, mask, eps_low, eps_high)
    # A=+1, r=1.5: max(-1.5, -1.3) = -1.3 (clipped, counts)
    # A=+1, r=0.5: max(-0.5, -0.8) = -0.5 (unclipped)
    # A=+2, r=1.1: inside the range, -2.2
    # A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped, counts)
    # A=-1, r=1.5: max(1.5, 1.3) = 1.5 (unclipped)
    # masked token: 0, and excluded from every metric
    assert loss.tolist() == [approx([-1.3, -0.5, -2.2]), approx([0.8, 1.5, 0.0])]
    assert metrics["clip_fraction"].item() == approx(2 / 5)
    assert metrics["ratio_mean"].item() == approx((1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5)
    assert metrics["ratio_max"].item() == approx(1.5)
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 0.5, 1.5)]  # KL(old || new) from old
    assert metrics["approx_kl"].item() == approx(sum(k3) / 5)
    # d loss / d logp = -A * r where the unclipped term is active, 0 where clipping is
    loss.sum().backward()
    assert logp.grad.tolist() == [approx([0.0, -0.5, -2.2]), approx([0.0, 1.5, 0.0])]
    assert not any(value.requires_grad for value in metrics.values())


# ---------------------------------------------------------------- rewards, values

RESPONSE_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


def test_scores_land_on_the_last_valid_token():
    rewards = F.token_rewards_from_scores(torch.tensor([1.0, -0.5, 2.0]), RESPONSE_MASK)
    # the third row has no valid token, so its score has nowhere to go
    assert rewards.tolist() == [[0, 0, 1.0, 0], [-0.5, 0, 0, 0], [0, 0, 0, 0]]


def test_kl_shaped_token_rewards():
    scores = torch.tensor([1.0, -0.5, 2.0])
    logp_old = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-0.2, 0, 0, 0], [0, 0, 0, 0]])
    logp_ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-0.7, 0, 0, 0], [0, 0, 0, 0]])
    rewards = F.token_rewards_from_scores(scores, RESPONSE_MASK, logp_old, logp_ref,
                                          kl_coef=0.1)
    # k1 = old - ref = 0.5, -1, 0 (row 0) and 0.5 (row 1); reward -= 0.1 * k1
    assert rewards.tolist() == [approx([-0.05, 0.1, 1.0, 0.0]), approx([-0.55, 0, 0, 0]),
                                [0, 0, 0, 0]]
    k3 = F.token_rewards_from_scores(scores, RESPONSE_MASK, logp_old, logp_ref, 0.1, "k3")
    # k3 for log ratio 0.5: e^-0.5 + 0.5 - 1 = 0.1065307; for -1: e^1 - 2 = 0.7182818
    assert k3[0].tolist() == approx([-0.01065307, -0.07182818, 1.0, 0.0])


def test_kl_shaping_needs_both_logprobs():
    with pytest.raises(ValueError, match="logp_old and logp_ref"):
        F.token_rewards_from_scores(torch.zeros(3), RESPONSE_MASK, kl_coef=0.1)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 50.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    assert F.explained_variance(returns.clone(), returns, mask).item() == approx(1.0)
    assert F.explained_variance(torch.zeros_like(returns), returns, mask).item() == approx(0.0)
    # errors 0,0,0,-1: biased var 0.1875; var of returns 1,2,3,4: 1.25 -> 1 - 0.15 = 0.85
    values = torch.tensor([[1.0, 2.0, 3.0, 5.0, -7.0]])
    assert F.explained_variance(values, returns, mask).item() == approx(0.85)
    constant = torch.full_like(returns, 2.0)
    assert F.explained_variance(values, constant, mask).item() == 0.0


# ---------------------------------------------------------------- groups

def test_group_stats_hand_values():
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0, 7.0, 7.0])
    group_ids = torch.tensor([10, 10, 10, 3, 8, 8])
    stats = F.group_stats(scores, group_ids)
    assert stats.count.tolist() == [3, 3, 3, 1, 2, 2]
    assert stats.sum.tolist() == [6, 6, 6, 5, 14, 14]
    assert stats.mean.tolist() == [2, 2, 2, 5, 7, 7]
    # group 10: ((1)^2 + 0 + 1^2) / (3 - 1) = 1; a group of one has std 0, not NaN
    assert stats.std.tolist() == [1, 1, 1, 0, 0, 0]


def test_sequence_scores_and_broadcast():
    rewards = torch.tensor([[0.1, 0.2, 1.0, 9.0], [3.0, 9.0, 9.0, 9.0], [9.0] * 4])
    scores = F.sequence_scores(rewards, RESPONSE_MASK)
    assert scores.tolist() == approx([1.3, 3.0, 0.0])
    assert F.broadcast_to_tokens(scores, RESPONSE_MASK).tolist() == [
        approx([1.3, 1.3, 1.3, 0.0]), [3.0, 0, 0, 0], [0, 0, 0, 0]]


def test_clipped_policy_loss_ignores_garbage_on_padding():
    # padding holding huge log-probs and an infinite advantage must not produce inf/NaN
    logp = torch.tensor([[-1.0, 500.0]], requires_grad=True)
    old_logp = torch.tensor([[-1.0, -500.0]])
    advantages = torch.tensor([[2.0, float("inf")]])
    mask = torch.tensor([[True, False]])
    loss, metrics = F.clipped_policy_loss(logp, old_logp, advantages, mask, 0.2, 0.2)
    loss.sum().backward()
    # the valid token has r = 1: loss -2, gradient -A * r = -2
    assert loss.tolist() == [[-2.0, 0.0]]
    assert logp.grad.tolist() == [[-2.0, 0.0]]
    assert metrics["ratio_max"].item() == 1.0
    assert metrics["approx_kl"].item() == 0.0
