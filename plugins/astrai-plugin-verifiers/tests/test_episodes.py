"""The verifiers environment in a run: episodes played by verifiers through astrai's serving
engine, scored by the rubric, trained on exactly the tokens the engine sampled."""

from __future__ import annotations

import pytest
import torch
import yaml
from verifiers_test_envs import exact, has_digit, write_tasks

from astrai_core.api import ConfigError
from astrai_core.testing import (build_strategy, fit_recording_rollouts, grpo_step_references,
                                 read_metrics, reference_token_logprobs, run_astrai,
                                 tiny_run_config, write_arith_prompts)

GROUP = 2


def _config(tmp_path, **environment):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")  # only their count is used
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": GROUP},
                             rewards=[], max_steps=2)
    config["data"]["batch_size"] = 2
    config["environment"] = {"name": "verifiers", "env": "verifiers_test_envs:arith",
                             "args": {"path": str(tasks)}, "max_turns": 2, **environment}
    return config


def _unpadded(ids, mask):
    return ids[mask.bool()].tolist()


@pytest.mark.slow
def test_rewards_are_the_rubrics_and_the_trained_tokens_are_the_sampled_ones(tmp_path):
    strategy, run = build_strategy(_config(tmp_path), tmp_path)
    batch = run.episodes.run([None, None], run.sampling, group_size=GROUP)
    client, episodes = run.episodes.last_client, run.episodes.last_episodes
    answers = [e.task.data.answer for e in episodes]
    assert answers == ["3", "3", "7", "7"]  # the first two tasks, GROUP episodes each
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    for i, episode in enumerate(episodes):
        (sample,) = client.streams[episode.traces[0].id].samples  # one turn: single-turn task
        assert _unpadded(batch.prompt_ids[i], batch.prompt_mask[i]) == sample.prompt_ids
        mask = batch.response_mask[i]
        assert batch.response_ids[i][mask].tolist() == sample.completion_ids
        assert torch.equal(batch.old_logprobs[i][mask],
                           torch.tensor(sample.logprobs, dtype=torch.float32))
        assert not batch.old_logprobs[i][~mask].any()
        # the rubric, recomputed here on the completion the engine sampled
        text = run.tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
        rubric = 0.5 * has_digit(text) + exact(text, answers[i])
        assert batch.rewards[i].item() == pytest.approx(rubric)
        assert batch.reward_components["verifiers/digit"][i].item() == has_digit(text)
    assert batch.reward_components["verifiers"].tolist() == batch.rewards.tolist()
    # the trainer's log-probs of the rows' response tokens are the sampler's: the rows hold
    # the sampled tokens at the positions where they were sampled
    reference = reference_token_logprobs(run.model, batch)
    for i, logps in enumerate(reference):
        sampled = batch.old_logprobs[i][batch.response_mask[i]].double()
        assert torch.allclose(logps, sampled, atol=1e-4), i


@pytest.mark.slow
def test_grpo_trains_two_steps_from_yaml(tmp_path):
    config = _config(tmp_path)
    config["strategy"]["group_size"] = 4  # so that each step's rubric scores differ
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_astrai("train", str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert 0.0 <= record["rollout/reward/verifiers"] <= 1.5
        assert record["rollout/turns_mean"] == 1.0
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "model.safetensors").exists()
    # the same run in this process, its rollouts recorded: each step's loss is the
    # on-policy GRPO loss by hand, and a step whose rubric scores differ within a group
    # raises its rollout's policy-gradient objective (concurrent episodes take their
    # seeds in the order they ask, so the rollouts need not be the subprocess's)
    config["output_dir"] = str(tmp_path / "recorded")
    strategy, run = build_strategy(config, tmp_path)
    drawn = fit_recording_rollouts(strategy, run)
    recorded = read_metrics(tmp_path / "recorded")
    assert len(drawn) == len(recorded) == 2
    references = grpo_step_references(drawn, run.model)
    for record, reference in zip(recorded, references):
        assert record["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-6)
        if reference["advantage_abs"] > 0:
            assert reference["after"] > reference["before"]
    assert any(reference["advantage_abs"] > 0 for reference in references)


def test_an_environment_that_does_not_load_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError) as error:
        build_strategy(_config(tmp_path, env="verifiers_test_envs:nothing"), tmp_path)
    assert "environment.env" in str(error.value) and "nothing" in str(error.value)
