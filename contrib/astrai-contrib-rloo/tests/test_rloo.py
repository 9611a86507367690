"""RLOO loaded by name through astrai's registry, checked on hand-computed groups."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from astrai_core.plugins import load_plugins


@pytest.fixture(scope="module")
def rloo_class():
    return load_plugins().get("advantage_estimator", "rloo").load()


def test_registered_by_the_contrib_distribution():
    registry = load_plugins()
    assert registry.provider("advantage_estimator", "rloo").distribution == "astrai-contrib-rloo"
    plugin = registry.plugin("rloo")
    assert plugin.status == "ok"
    assert plugin.provides["advantage_estimator"] == ["rloo"]


def test_leave_one_out_advantages(rloo_class):
    # Scores (sums of token rewards over valid tokens; 9.0 sits on padding):
    #   group 0: 3, 1, 2 -> baselines (1+2)/2 = 1.5, (3+2)/2 = 2.5, (3+1)/2 = 2
    #                    -> advantages 1.5, -1.5, 0
    #   group 5: 4, 0    -> baselines 0, 4 -> advantages 4, -4
    #   group 9: 7 alone -> 0
    token_rewards = torch.tensor([
        [0.5, 2.5, 9.0], [1.0, 9.0, 9.0], [-1.0, 1.0, 2.0],
        [4.0, 9.0, 9.0], [0.3, -0.3, 9.0], [7.0, 9.0, 9.0],
    ])
    response_mask = torch.tensor([
        [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0],
    ], dtype=torch.bool)
    group_ids = torch.tensor([0, 0, 0, 5, 5, 9])
    estimator = rloo_class()
    assert estimator.needs_values is False
    advantages, returns = estimator(token_rewards=token_rewards, response_mask=response_mask,
                                    group_ids=group_ids)
    assert returns is None
    expected = torch.tensor([1.5, -1.5, 0.0, 4.0, -4.0, 0.0])[:, None] * response_mask
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)


def test_unknown_option_is_rejected(rloo_class):
    with pytest.raises(ValidationError, match="baseline"):
        rloo_class(baseline="mean")
