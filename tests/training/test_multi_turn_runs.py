"""Multi-turn runs end to end: the environment section, an outside environment selected in
YAML, GRPO/PPO/online DPO training on episodes, and exact resume of a multi-turn run."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.errors import ConfigError
from astrai_core.testing import REPO_ROOT, build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from tests.training.conftest import astrai, write_config
from tests.training.test_resume import TIMING, killed_after_checkpoint

OUTSIDE = "tests.rollout.episode_kit"  # an environment plugin module, as an outsider writes one
ENVIRONMENT = {"name": "echo_turns", "rounds": 2, "max_turns": 3, "max_tokens": 64}
# Every token ends a turn: turns are one token, so each episode is exactly `rounds` turns.
ONE_TOKEN_TURNS = {"stop_token_ids": list(range(55)), "max_new_tokens": 3}
STEPS = 4


@pytest.fixture
def outside_plugin(monkeypatch):
    monkeypatch.setenv("ASTRAI_PLUGINS", OUTSIDE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _config(tmp_path, strategy, name="run", environment=None, **trainer):
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        write_arith_prompts(prompts)
    config = tiny_run_config(tmp_path, prompts, strategy, sampler=ONE_TOKEN_TURNS,
                             **{"max_steps": STEPS, **trainer})
    config["data"]["batch_size"] = 4
    config["environment"] = dict(environment or ENVIRONMENT)
    config["output_dir"] = str(tmp_path / name)
    return config


STRATEGIES = {
    "grpo": {"name": "grpo", "group_size": 4},
    "ppo": {"name": "ppo", "group_size": 4, "critic_lr": 3e-3},
    "online dpo": {"name": "dpo", "mode": "online", "group_size": 4, "beta": 0.5},
}


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_online_strategies_train_on_episodes_of_an_outside_environment(tmp_path, outside_plugin,
                                                                       strategy):
    config = _config(tmp_path, strategy, max_steps=2)
    path = write_config(tmp_path, config)
    done = astrai("train", str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["rollout/turns_mean"] == 2.0  # the environment's two rounds
        assert record["rollout/max_turns_fraction"] == 0.0
        assert "rollout/reward/environment" in record
        assert all(v == v for v in record.values() if isinstance(v, float))  # no NaN
    step = load_file(str(tmp_path / "run" / "checkpoints" / "step_2" / "model.safetensors"))
    assert step  # a complete checkpoint


def test_episodes_reach_the_strategy_with_environment_tokens_masked(tmp_path, outside_plugin):
    strategy, run = build_strategy(_config(tmp_path, STRATEGIES["grpo"]), tmp_path)
    batch = strategy.batch_source().next_step()[0]
    assert batch.context_mask is not None
    assert batch.response_mask.sum(1).tolist() == [2] * len(batch)  # one token per turn
    assert (batch.context_mask.sum(1) > 2).all()  # plus the environment's message
    assert not batch.advantages[~batch.response_mask].any()
    assert not batch.old_logprobs[~batch.response_mask].any()
    loss, _ = strategy.compute_loss(batch)
    assert torch.isfinite(loss)


def test_the_environment_section_is_checked_before_the_run(tmp_path, outside_plugin):
    def fails(environment, strategy=STRATEGIES["grpo"]):
        with pytest.raises(ConfigError) as error:
            build_strategy(_config(tmp_path, strategy, environment=environment), tmp_path)
        return str(error.value)

    assert "environment.bogus: unknown option; options: rounds" in fails({**ENVIRONMENT, "bogus": 1})
    assert "environment.max_turns" in fails({**ENVIRONMENT, "max_turns": 0})
    assert "unknown environment 'nope'" in fails({"name": "nope"})
    assert "environment.tools" in fails({"name": "tools", "tools": ["no_such_module:f"]})
    assert "environment.timeout" in fails({"name": "tools", "timeout": 0,
                                           "tools": ["astrai_core.environments.calculator:calculator"]})
    message = fails({"name": "tools", "tools": ["astrai_core.environments.calculator:calculator"],
                     "bogus": 1})
    assert "environment.bogus" in message


@pytest.mark.parametrize("strategy,kill_after,files", [
    ({"name": "grpo", "group_size": 4, "epochs": 2}, 3, ("model",)),
    ({"name": "ppo", "group_size": 4, "epochs": 2, "critic_lr": 3e-3}, 1, ("model", "critic")),
], ids=["grpo killed mid-rollout", "ppo killed mid-rollout"])
def test_a_multi_turn_run_resumed_equals_the_uninterrupted_run(tmp_path, outside_plugin, strategy,
                                                               kill_after, files):
    reference = write_config(tmp_path, _config(tmp_path, strategy, "reference", save_every=1),
                             "reference.yaml")
    assert astrai("train", str(reference)).returncode == 0
    path = write_config(tmp_path, _config(tmp_path, strategy, "interrupted", save_every=1),
                        "interrupted.yaml")
    killed = killed_after_checkpoint(kill_after, "train", str(path))
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = astrai("train", str(path), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = f"checkpoints/step_{STEPS}"
    for name in files:
        want = load_file(str(tmp_path / "reference" / final / f"{name}.safetensors"))
        got = load_file(str(tmp_path / "interrupted" / final / f"{name}.safetensors"))
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), name
    timing = (*TIMING, "rollout/env_seconds")
    strip = lambda r: {k: v for k, v in r.items() if k not in timing}  # noqa: E731
    want = [strip(r) for r in read_metrics(tmp_path / "reference")]
    have = [strip(r) for r in read_metrics(tmp_path / "interrupted")]
    assert [r["step"] for r in have] == list(range(1, STEPS + 1))
    assert have == want


def test_an_environment_may_play_and_score_its_episodes_itself(tmp_path, outside_plugin):
    config = _config(tmp_path, STRATEGIES["grpo"], environment={"name": "own_episodes"})
    config["rewards"] = []  # the environment scores its episodes (rewards_episodes)
    strategy, run = build_strategy(config, tmp_path)
    batch = strategy.batch_source().next_step()[0]
    assert run.episodes.calls == [(4, 4)]  # its runner replaced astrai's episode runner
    assert sorted(batch.rewards.tolist()) == [0.0] * 4 + [0.25] * 4 + [0.5] * 4 + [0.75] * 4
    assert batch.response_mask.tolist() == [[True, True, False, True]] * 16
    assert not batch.advantages[~batch.response_mask].any()
    loss, _ = strategy.compute_loss(batch)
    assert torch.isfinite(loss)
    config["environment"] = dict(ENVIRONMENT)  # an environment that does not score: rewards needed
    with pytest.raises(ConfigError, match="rewards: an online strategy needs at least one"):
        build_strategy(config, tmp_path)
