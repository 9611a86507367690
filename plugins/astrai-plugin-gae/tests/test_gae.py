"""The gae estimator on hand-computed cases."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from astrai_core.config.plan import Resolver
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.rl import functional
from astrai_plugin_gae.advantage import GAE

GARBAGE = 7.0  # on masked positions; must change nothing


def _gae(token_rewards, values, response_mask, **params):
    params.setdefault("whiten", False)
    return GAE(**params)(token_rewards=torch.tensor(token_rewards),
                         values=torch.tensor(values),
                         response_mask=torch.tensor(response_mask, dtype=torch.bool),
                         group_ids=torch.arange(len(token_rewards)))


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-6, rtol=0)


def test_single_step():
    # delta = r + gamma * 0 (terminal) - V = 1 - 0.4 = 0.6; return = A + V = 1
    advantages, returns = _gae([[1.0]], [[0.4]], [[1]], gamma=0.9, lam=0.8)
    _close(advantages, [[0.6]])
    _close(returns, [[1.0]])


def test_gamma_lambda_one_is_reward_to_go_minus_value():
    # rewards -0.1, 0.2, 1.0 -> reward-to-go 1.1, 1.2, 1.0; V = 0.5, 0.2, 0.7
    advantages, returns = _gae([[-0.1, 0.2, 1.0]], [[0.5, 0.2, 0.7]], [[1, 1, 1]],
                               gamma=1.0, lam=1.0)
    _close(advantages, [[0.6, 1.0, 0.3]])
    _close(returns, [[1.1, 1.2, 1.0]])


# gamma 0.9, lambda 0.8 (gamma*lambda = 0.72), r = 0.1, -0.2, 1.0, V = 0.5, 0.3, 0.6:
#   delta_2 = 1.0 + 0.9*0   - 0.6 = 0.4
#   delta_1 = -0.2 + 0.9*0.6 - 0.3 = 0.04
#   delta_0 = 0.1 + 0.9*0.3 - 0.5 = -0.13
#   A_2 = 0.4;  A_1 = 0.04 + 0.72*0.4 = 0.328;  A_0 = -0.13 + 0.72*0.328 = 0.10616
#   returns = A + V = 0.60616, 0.628, 1.0
A_HAND = [0.10616, 0.328, 0.4]
R_HAND = [0.60616, 0.628, 1.0]


def test_generic_gamma_and_lambda_by_hand():
    advantages, returns = _gae([[0.1, -0.2, 1.0]], [[0.5, 0.3, 0.6]], [[1, 1, 1]],
                               gamma=0.9, lam=0.8)
    _close(advantages, [A_HAND])
    _close(returns, [R_HAND])


def test_trailing_padding_gives_zero_and_changes_nothing():
    # row 0 is the hand case padded to 5; row 1 is one token: A = 1 - 0.25 = 0.75
    advantages, returns = _gae(
        [[0.1, -0.2, 1.0, GARBAGE, GARBAGE], [1.0, GARBAGE, GARBAGE, GARBAGE, GARBAGE]],
        [[0.5, 0.3, 0.6, GARBAGE, -GARBAGE], [0.25, GARBAGE, GARBAGE, GARBAGE, GARBAGE]],
        [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], gamma=0.9, lam=0.8)
    _close(advantages, [A_HAND + [0, 0], [0.75, 0, 0, 0, 0]])
    _close(returns, [R_HAND + [0, 0], [1.0, 0, 0, 0, 0]])


def test_masked_token_inside_a_response_is_skipped():
    # the hand case with a masked (e.g. tool-output) token inserted at position 1
    advantages, returns = _gae([[0.1, GARBAGE, -0.2, 1.0]], [[0.5, GARBAGE, 0.3, 0.6]],
                               [[1, 0, 1, 1]], gamma=0.9, lam=0.8)
    _close(advantages, [[A_HAND[0], 0.0, A_HAND[1], A_HAND[2]]])
    _close(returns, [[R_HAND[0], 0.0, R_HAND[1], R_HAND[2]]])


def test_whitening_is_mean_zero_std_one_on_valid_tokens_and_returns_stay_raw():
    rewards = [[0.1, -0.2, 1.0, GARBAGE], [1.0, GARBAGE, GARBAGE, GARBAGE]]
    values = [[0.5, 0.3, 0.6, GARBAGE], [0.25, GARBAGE, GARBAGE, GARBAGE]]
    mask = [[1, 1, 1, 0], [1, 0, 0, 0]]
    advantages, returns = _gae(rewards, values, mask, gamma=0.9, lam=0.8, whiten=True)
    valid = torch.tensor(mask, dtype=torch.bool)
    raw = torch.tensor(A_HAND + [0.75])  # valid tokens in row-major order
    torch.testing.assert_close(advantages[valid], (raw - raw.mean()) / raw.std(),
                               atol=1e-5, rtol=0)
    assert advantages[valid].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert advantages[valid].std().item() == pytest.approx(1.0, abs=1e-5)
    assert advantages[~valid].abs().sum().item() == 0.0
    _close(returns, [R_HAND + [0], [1.0, 0, 0, 0]])


def test_kl_shaped_rewards_through_gae():
    from astrai_plugin_gae import token_rewards_from_scores

    assert token_rewards_from_scores is functional.token_rewards_from_scores
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    rewards = token_rewards_from_scores(
        torch.tensor([1.0]), mask, logp_old=torch.tensor([[-1.0, -2.0, 0.0]]),
        logp_ref=torch.tensor([[-1.5, -1.5, 0.0]]), kl_coef=0.2)
    # k1 = 0.5, -0.5 -> shaping -0.1, +0.1; the score 1 sits on token 1
    _close(rewards, [[-0.1, 1.1, 0.0]])
    advantages, returns = GAE(gamma=1.0, lam=1.0, whiten=False)(
        token_rewards=rewards, response_mask=mask, group_ids=torch.tensor([0]),
        values=torch.zeros(1, 3))
    _close(advantages, [[1.0, 1.1, 0.0]])  # reward-to-go with V = 0


@pytest.mark.parametrize("params, field", [
    ({"gamma": 1.5}, "gamma"),
    ({"lambda": -0.1}, "lambda"),
    ({"lam": -0.1}, "lam"),
    ({"lam": 0.9, "lambda": 0.9}, "not both"),
    ({"whiten": "sometimes"}, "whiten"),
    ({"gama": 0.9}, "gama"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ValidationError, match=field):
        GAE(**params)


def test_lambda_spelling_and_config_section_round_trip():
    assert GAE(**{"lambda": 0.5}).config.lam == 0.5
    resolver = Resolver(load_plugins())
    validated = resolver.component("advantage_estimator", "gae",
                                   {"gamma": 0.99, "lambda": 0.9}, ("advantage",)).options
    assert GAE(**validated).config.lam == 0.9
    with pytest.raises(ConfigError, match=r"advantage\.gamma"):
        resolver.component("advantage_estimator", "gae", {"gamma": 1.5}, ("advantage",))


def test_missing_values_is_a_clear_error():
    with pytest.raises(ConfigError, match="gae needs values from a critic"):
        GAE()(token_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2),
              group_ids=torch.zeros(1, dtype=torch.long))


def test_registered_by_name():
    estimator_class = load_plugins().get("advantage_estimator", "gae").load()
    assert estimator_class is GAE
    assert estimator_class.needs_values is True
