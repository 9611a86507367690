"""PPO moves what it optimises: the reward goes up, the critic fits returns, and the critic
resumes exactly from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.checkpoints.sharded import read_sharded
from astrai_core.config.schema import RunConfig
from astrai_core.testing import read_metrics
from astrai_core.training.run import train
from astrai_core.training.trainer import Trainer

REWARD_PLUGIN = '''
from astrai_core import RewardFunctionSpec, hookimpl


def count_digits(prompts, completions, **columns):
    return [float(sum(ch.isdigit() for ch in completion)) for completion in completions]


@hookimpl
def astrai_reward_functions():
    return [RewardFunctionSpec(name="count_digits", target="ppo_test_digits:count_digits",
                               summary="number of digits in the completion")]
'''


@pytest.fixture
def digits_reward(tmp_path, monkeypatch):
    """A reward a tiny from-scratch model can learn quickly: how many digits it writes."""
    plugin_dir = tmp_path / "reward_plugin"
    plugin_dir.mkdir()
    (plugin_dir / "ppo_test_digits.py").write_text(REWARD_PLUGIN)
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("ASTRAI_PLUGINS", "ppo_test_digits")


def test_a_few_ppo_steps_raise_the_mean_reward(ppo, tmp_path, digits_reward):
    config = ppo.run_config(tmp_path, {"group_size": 4, "epochs": 2, "mini_batches": 1,
                                       "critic_lr": 1e-2}, max_steps=12)
    config["rewards"] = [{"name": "count_digits"}]
    config["data"]["batch_size"] = 8
    config["sampler"]["stop_token_ids"] = []  # always 4 tokens: room for 4 digits
    config["advantage"] = {"name": "gae", "gamma": 1.0, "lambda": 1.0}
    train(RunConfig.model_validate(config))
    # Each rollout serves epochs x mini_batches = 2 steps: take one record per rollout.
    rewards = [m["rollout/reward_mean"] for m in read_metrics(tmp_path / "run")][::2]
    assert len(rewards) == 6
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.5, rewards


def test_critic_value_loss_goes_down_on_a_fixed_rollout(ppo, tmp_path):
    # A wide value clip, so the loss is free to fall below the clipped term's floor.
    strategy, context = ppo.make_strategy(tmp_path, ppo.run_config(
        tmp_path, {"critic_lr": 3e-3, "value_clip_eps": 100.0, "mini_batches": 1}))
    trainer = Trainer(context, strategy)
    critic = next(module for module in trainer.modules if module.name == "critic")
    batch = trainer.source.next_step()[0]
    returns = batch.returns[batch.response_mask]
    assert returns.std() > 0.1, "the rollout needs varied returns to fit"
    policy_before = {k: v.clone() for k, v in context.model.state_dict().items()}
    losses = []
    for step in range(1, 16):
        loss, metrics = strategy.compute_loss(batch)
        losses.append(metrics["value_loss"].item())
        loss.backward()
        context.model.zero_grad(set_to_none=True)  # only the critic steps here
        critic.clip()
        critic.step()
    assert losses[-1] < 0.5 * losses[0], losses
    for name, tensor in context.model.state_dict().items():
        assert torch.equal(tensor, policy_before[name]), f"the critic's step moved the policy ({name})"


def _critic_state(run_dir: Path, step: int) -> tuple[dict, dict, dict]:
    checkpoint = run_dir / "checkpoints" / f"step_{step}"
    return (load_file(str(checkpoint / "critic.safetensors")),
            load_file(str(checkpoint / "model.safetensors")),
            read_sharded(checkpoint)["optimizers"]["critic"])  # the DCP training state


def _assert_equal_nested(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal_nested(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal_nested(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_resumed_run_restores_critic_and_its_optimizer_exactly(ppo, tmp_path):
    # Rollouts of epochs x mini_batches = 2 steps; checkpoints every 2 steps (at rollout ends).
    strategy = {"epochs": 2, "mini_batches": 1, "critic_lr": 3e-3}
    reference = ppo.run_config(tmp_path, strategy, max_steps=4, save_every=2)
    reference["output_dir"] = str(tmp_path / "reference")
    train(RunConfig.model_validate(reference))

    interrupted = dict(reference, output_dir=str(tmp_path / "interrupted"))
    interrupted["trainer"] = dict(reference["trainer"], max_steps=2)
    train(RunConfig.model_validate(interrupted))
    interrupted["trainer"] = dict(reference["trainer"])
    train(RunConfig.model_validate(interrupted), resume=True)

    expected = _critic_state(tmp_path / "reference", 4)
    got = _critic_state(tmp_path / "interrupted", 4)
    for what, a, b in zip(("critic", "policy", "critic optimizer"), expected, got):
        _assert_equal_nested(a, b, what)
    # The critic really trained between the checkpoints (so the comparison means something).
    step_2 = _critic_state(tmp_path / "reference", 2)[0]
    assert any(not torch.equal(step_2[k], expected[0][k]) for k in step_2)
    assert expected[2]["state"], "the critic optimizer has state"
