"""astrai-contrib-reinforce through astrai's registry and test kit: registered by name,
the baseline on hand-computed groups, the loss against its formula, and a short run
that raises the reward."""

from __future__ import annotations

import pytest
import torch
import yaml
from pydantic import ValidationError

from astrai_core.config.loader import load_config
from astrai_core.plugins import load_plugins
from astrai_core.testing import (build_strategy, read_metrics, reference_token_logprobs,
                                 tiny_run_config, write_arith_prompts)
from astrai_core.training.run import train


@pytest.fixture
def prompts(tmp_path):
    return write_arith_prompts(tmp_path / "prompts.jsonl")


def test_registered_by_the_contrib_distribution():
    registry = load_plugins()
    for kind, name in (("strategy", "reinforce"), ("advantage_estimator", "reinforce_baseline")):
        assert registry.provider(kind, name).distribution == "astrai-contrib-reinforce"
    assert registry.get("strategy", "reinforce").default_advantage == "reinforce_baseline"
    assert registry.plugin("reinforce").status == "ok"


# Scores (sums of token rewards over valid tokens; 9.0 sits on padding):
#   group 0: 3, 1, 2 (mean 2) -> 1, -1, 0;  group 5: 4, 0 (mean 2) -> 2, -2;  group 9: 7 -> 0
# Whole rollout: mean 17/6.
TOKEN_REWARDS = torch.tensor([[0.5, 2.5, 9.0], [1.0, 9.0, 9.0], [-1.0, 1.0, 2.0],
                              [4.0, 9.0, 9.0], [0.3, -0.3, 9.0], [7.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]],
                    dtype=torch.bool)
SCORES = torch.tensor([3.0, 1.0, 2.0, 4.0, 0.0, 7.0])


@pytest.mark.parametrize("baseline,expected", [
    ("group", torch.tensor([1.0, -1.0, 0.0, 2.0, -2.0, 0.0])),
    ("batch", SCORES - 17 / 6),
    ("none", SCORES),
])
def test_mean_baseline_on_hand_computed_groups(baseline, expected):
    estimator = load_plugins().get("advantage_estimator", "reinforce_baseline").load()(
        baseline=baseline)
    assert estimator.needs_values is False
    advantages, returns = estimator(token_rewards=TOKEN_REWARDS, response_mask=MASK,
                                    group_ids=torch.tensor([0, 0, 0, 5, 5, 9]))
    assert returns is None
    torch.testing.assert_close(advantages, expected[:, None] * MASK, atol=1e-6, rtol=0)


def test_reusing_a_rollout_is_refused():
    from astrai_contrib_reinforce.strategy import ReinforceConfig

    with pytest.raises(ValidationError, match="on-policy"):
        ReinforceConfig(epochs=2)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.1])
def test_loss_equals_the_formula_on_a_hand_made_batch(tmp_path, prompts, entropy_coef):
    temperature = 0.7
    config = tiny_run_config(tmp_path, prompts, {"name": "reinforce", "group_size": 2,
                                                 "entropy_coef": entropy_coef})
    config["sampler"]["temperature"] = temperature
    strategy, run = build_strategy(config, tmp_path)
    batch = strategy.batch_source().next_step()[0]   # a real rollout, processed
    advantages = torch.tensor([1.5, -0.5, 0.25, -2.0] * 4)[: len(batch.response_ids)]
    batch.advantages = advantages[:, None] * batch.response_mask   # by hand
    loss, metrics = strategy.compute_loss(batch)

    reference = reference_token_logprobs(run.model, batch, temperature)
    expected = -sum(a * logp.sum() for a, logp in zip(advantages.double(), reference))
    expected = expected / len(reference)
    assert metrics["tokens"] == batch.response_mask.sum()
    torch.testing.assert_close(metrics["policy_loss"].double(), expected, atol=1e-5, rtol=1e-5)
    if entropy_coef:
        assert torch.isclose(loss, metrics["policy_loss"] - entropy_coef * metrics["entropy"])
    else:
        assert loss.item() == pytest.approx(expected.item(), abs=1e-5)


def test_kl_shaping_uses_a_frozen_reference(tmp_path, prompts):
    config = tiny_run_config(tmp_path, prompts, {"name": "reinforce", "group_size": 2,
                                                 "kl_in_reward_coef": 0.5})
    strategy, run = build_strategy(config, tmp_path)
    assert set(strategy.frozen_modules()) == {"reference"}
    with torch.no_grad():  # make the reference differ from the policy
        for param in strategy.reference.parameters():
            param.add_(0.05 * torch.randn_like(param))
    batch = strategy.batch_source().next_step()[0]
    reference = reference_token_logprobs(strategy.reference, batch, run.logprob_temperature)
    for row, expected in enumerate(reference):
        got = batch.ref_logprobs[row][batch.response_mask[row]].double()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    unshaped = build_strategy(tiny_run_config(tmp_path, prompts, {"name": "reinforce",
                                                                  "group_size": 2}),
                              tmp_path)[0]
    assert unshaped.frozen_modules() == {}


def test_a_short_run_raises_the_reward(tmp_path, prompts):
    # Reward: the completion contains a digit (~45% for the random tiny model).
    config = tiny_run_config(tmp_path, prompts, {"name": "reinforce", "group_size": 8},
                             max_steps=8, lr=2e-2)
    config["data"]["batch_size"] = 4
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    train(load_config(path))
    metrics = [m for m in read_metrics(tmp_path / "run") if "rollout/reward_mean" in m]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    first = metrics[0]["rollout/reward_mean"]
    last = sum(m["rollout/reward_mean"] for m in metrics[-3:]) / 3
    assert first < 0.7
    assert last > first + 0.25, (first, last)
    assert {"policy_loss", "seq_logprob_mean", "rollout/advantage_mean"} <= set(metrics[-1])
