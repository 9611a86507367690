"""The built-in policy losses and their gradients against their formulas, on hand-picked cases."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from astrai_core.plugins import load_plugins
from astrai_core.rl.functional import aggregate_loss
from astrai_core.rl.policy_losses import CISPO, GSPO, DualClip, PPOClip


def _leaf(rows):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=True)


def _call(loss, logp, old, adv, mask, **extras):
    return loss(logprobs=logp, old_logprobs=torch.tensor(old, dtype=torch.float64),
                advantages=torch.tensor(adv, dtype=torch.float64),
                response_mask=torch.tensor(mask), **extras)


# One row of four tokens: log-ratios +0.5 and -0.5, each with A = +2 and A = -2.
OLD = [[-1.0, -1.0, -1.0, -1.0]]
LOGP = [[-0.5, -1.5, -0.5, -1.5]]
ADV = [[2.0, 2.0, -2.0, -2.0]]
MASK = [[True, True, True, True]]
UP, DOWN = math.exp(0.5), math.exp(-0.5)   # 1.6487, 0.6065


def test_ppo_clip_value_and_gradient_with_asymmetric_bounds():
    logp = _leaf(LOGP)
    per_token, metrics = _call(PPOClip(eps_low=0.2, eps_high=0.28), logp, OLD, ADV, MASK)
    # r=1.65, A>0: clipped at 1.28 | r=0.61, A>0: -A r | r=1.65, A<0: -A r | r=0.61, A<0: clip 0.8
    expected = [-2 * 1.28, -2 * DOWN, 2 * UP, 2 * 0.8]
    assert per_token[0].tolist() == pytest.approx(expected)
    per_token.sum().backward()
    # d(-A r)/dlogp = -A r where the unclipped term is chosen, 0 where the clip is
    assert logp.grad[0].tolist() == pytest.approx([0.0, -2 * DOWN, 2 * UP, 0.0])
    assert metrics["clip_fraction"].item() == pytest.approx(0.5)
    assert metrics["ratio_max"].item() == pytest.approx(UP)


def test_dual_clip_caps_the_loss_of_negative_advantages():
    old = [[-1.0, -1.0, -1.0, -1.0]]
    logp = _leaf([[0.5, -0.5, 0.5, -1.5]])   # r = e^1.5 = 4.48, e^0.5, e^1.5, e^-0.5
    adv = [[-2.0, -2.0, 2.0, -2.0]]
    per_token, metrics = _call(DualClip(eps_low=0.2, eps_high=0.2, c=3.0), logp, old, adv, MASK)
    # A<0, r=4.48: PPO-clip gives 2*4.48, capped at -A c = 6 | A<0, r=1.65: 2*1.65 < 6 stays
    # A>0, r=4.48: clipped at 1.2 (no dual clip for A>0) | A<0, r=0.61: clipped at 0.8
    assert per_token[0].tolist() == pytest.approx([6.0, 2 * UP, -2 * 1.2, 2 * 0.8])
    per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 2 * UP, 0.0, 0.0])
    assert metrics["dual_clip_fraction"].item() == pytest.approx(0.25)


def test_gspo_sequence_ratio_on_ragged_lengths_matches_the_sequence_objective():
    # Row 0: 3 tokens, log-ratios 0.3, -0.1, 0.1 -> s0 = exp(0.1); row 1: 1 token, -0.02.
    old = [[-1.0, -2.0, -1.5], [-0.7, 0.0, 0.0]]
    logp = _leaf([[-0.7, -2.1, -1.4], [-0.72, 9.0, -9.0]])  # garbage on row 1's padding
    adv = [[1.0, 1.0, 1.0], [-0.5, 0.0, 0.0]]
    mask = [[True, True, True], [True, False, False]]
    eps_low, eps_high = 0.01, 0.05
    per_token, metrics = _call(GSPO(eps_low=eps_low, eps_high=eps_high), logp, old, adv, mask)
    s0, s1 = math.exp(0.1), math.exp(-0.02)
    # s0 = 1.105 > 1.05 with A > 0: clipped; s1 = 0.980 < 0.99 with A < 0: clipped too.
    assert per_token[0].tolist() == pytest.approx([-1.05] * 3)
    assert per_token[1].tolist() == pytest.approx([0.5 * 0.99, 0.0, 0.0])
    # With eps_low = 0.03, s1 is inside [0.97, 1.05]: row 1 takes the unclipped branch.
    per_token = _call(GSPO(eps_low=0.03, eps_high=eps_high), logp, old, adv, mask)[0]
    assert per_token[1].tolist() == pytest.approx([0.5 * s1, 0.0, 0.0])
    loss = aggregate_loss(per_token, torch.tensor(mask), "seq-mean-token-mean")
    # The sequence objective: mean_i max(-A_i s_i, -A_i clip(s_i)) = (-1.05 + 0.5 s1) / 2
    assert loss.item() == pytest.approx((-1.05 + 0.5 * s1) / 2)
    loss.backward()
    # Row 0 is clipped: no gradient. Row 1 (one token): d(0.5 s1 / 2)/dlogp = 0.5 s1 / 2.
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert logp.grad[1].tolist() == pytest.approx([0.25 * s1, 0.0, 0.0])
    assert metrics["seq_clip_fraction"].item() == pytest.approx(1.0)
    assert metrics["ratio_mean"].item() == pytest.approx((s0 + s1) / 2)


def test_gspo_gradient_spreads_the_sequence_ratio_over_its_tokens():
    old = [[-1.0, -2.0, -1.5], [-0.7, -1.0, 0.0]]
    logp = _leaf([[-0.98, -2.0, -1.49], [-0.71, -1.01, 0.0]])  # lengths 3 and 2
    adv = [[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]]
    mask = [[True, True, True], [True, True, False]]
    per_token, _ = _call(GSPO(eps_low=0.2, eps_high=0.2), logp, old, adv, mask)  # unclipped
    s0, s1 = math.exp(0.03 / 3), math.exp(-0.02 / 2)
    assert per_token[0].tolist() == pytest.approx([-s0] * 3)
    assert per_token[1].tolist() == pytest.approx([0.5 * s1, 0.5 * s1, 0.0])
    aggregate_loss(per_token, torch.tensor(mask), "seq-mean-token-mean").backward()
    # J = (-s0 + 0.5 s1) / 2 and ds_i/dlogp_t = s_i / L_i
    assert logp.grad[0].tolist() == pytest.approx([-s0 / 3 / 2] * 3)
    assert logp.grad[1].tolist() == pytest.approx([0.5 * s1 / 2 / 2] * 2 + [0.0])


def test_cispo_keeps_a_clipped_stop_gradient_weight_on_every_token():
    logp = _leaf(LOGP)
    per_token, metrics = _call(CISPO(eps_low=0.2, eps_high=0.28), logp, OLD, ADV, MASK)
    weights = [1.28, 0.8, 1.28, 0.8]          # clip(r, 0.8, 1.28) of r = 1.65, 0.61, ...
    expected = [-w * a * lp for w, a, lp in zip(weights, ADV[0], LOGP[0])]
    assert per_token[0].tolist() == pytest.approx(expected)
    per_token.sum().backward()
    # d/dlogp of -sg(w) A logp = -w A, even on the clipped tokens
    assert logp.grad[0].tolist() == pytest.approx([-w * a for w, a in zip(weights, ADV[0])])
    assert metrics["clip_fraction"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("loss", [PPOClip(), DualClip(), GSPO(), CISPO()])
def test_rollout_weights_scale_each_token_and_padding_is_inert(loss):
    mask = [[True, True, False]]
    old = [[-1.0, -1.2, -1e4]]
    adv = [[0.7, -0.4, 1e4]]
    logp = _leaf([[-1.1, -1.0, 1e4]])
    plain, _ = _call(loss, logp, old, adv, mask)
    weights = torch.tensor([[0.5, 2.0, float("nan")]], dtype=torch.float64)
    weighted, _ = _call(loss, logp, old, adv, mask, rollout_weights=weights)
    assert weighted[0, :2].tolist() == pytest.approx((plain[0, :2] * weights[0, :2]).tolist())
    assert weighted[0, 2].item() == 0.0 and plain[0, 2].item() == 0.0
    weighted.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2].item() == 0.0


def test_options_are_validated_and_the_builtins_are_registered():
    registry = load_plugins()
    assert {"ppo_clip", "dual_clip", "gspo", "cispo"} <= set(registry.names("policy_loss"))
    assert registry.get("policy_loss", "gspo").load() is GSPO
    with pytest.raises(ValidationError, match="greater than 1"):
        DualClip.Config.model_validate({"c": 0.9})
    with pytest.raises(ValidationError, match="less than 1"):
        PPOClip.Config.model_validate({"eps_low": 1.0})
    with pytest.raises(ValidationError, match="Extra inputs"):
        GSPO.Config.model_validate({"clip": 0.1})


def test_the_objective_adds_kl_and_entropy_and_passes_the_extras():
    from astrai_core.rl.objective import ObjectiveSettings, PolicyObjective

    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp = _leaf([[-1.0, -2.0, 50.0], [-0.5, 0.0, 0.0]])
    old = torch.tensor([[-1.1, -1.9, -50.0], [-0.4, 0.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.2, -2.2, 1e4], [-0.6, 0.0, 0.0]], dtype=torch.float64)  # garbage
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]], dtype=torch.float64)
    entropy = torch.tensor([[0.3, 0.5, 9.0], [0.7, 9.0, 9.0]], dtype=torch.float64)
    weights = torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.0, 0.0]], dtype=torch.float64)
    objective = PolicyObjective(GSPO(eps_low=0.5, eps_high=0.5), ObjectiveSettings(
        loss_aggregation="seq-mean-token-mean", kl_coef=0.1, kl_estimator="k3",
        entropy_coef=0.01))
    loss, metrics = objective(logprobs=logp, old_logprobs=old, advantages=adv,
                              response_mask=mask, ref_logprobs=ref, entropy=entropy,
                              extras={"rollout_weights": weights})
    s0, s1 = math.exp((0.1 - 0.1) / 2), math.exp(-0.1)
    k3 = lambda lp, r: math.exp(r - lp) - (r - lp) - 1  # noqa: E731
    row0 = [2.0 * -s0 + 0.1 * k3(-1.0, -1.2) - 0.01 * 0.3,
            0.5 * -s0 + 0.1 * k3(-2.0, -2.2) - 0.01 * 0.5]
    row1 = 1.5 * 2.0 * s1 + 0.1 * k3(-0.5, -0.6) - 0.01 * 0.7
    assert loss.item() == pytest.approx((sum(row0) / 2 + row1) / 2)
    assert metrics["kl"].item() == pytest.approx(
        (k3(-1.0, -1.2) + k3(-2.0, -2.2) + k3(-0.5, -0.6)) / 3)
    assert metrics["entropy"].item() == pytest.approx((0.3 + 0.5 + 0.7) / 3)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0
