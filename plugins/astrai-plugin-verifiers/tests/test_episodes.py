"""The verifiers environment in a run: episodes played by verifiers through astrai's serving
engine, scored by the rubric, trained on exactly the tokens the engine sampled."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch
import yaml
from verifiers_test_envs import exact, has_digit, write_tasks

from astrai_core.api import ConfigError
from astrai_core.testing import (build_strategy, fit_recording_rollouts, grpo_step_references,
                                 read_metrics, reference_token_logprobs, run_astrai,
                                 tiny_run_config, write_arith_prompts)
from astrai_plugin_verifiers.client import EngineClient

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


def _reverse_arrivals(monkeypatch, env, episodes: int, delay: float) -> None:
    """Episode i of each rollout of ``episodes`` starts ``(episodes - 1 - i) * delay``
    seconds late: the episodes ask for their turns in reverse order."""
    play, calls = env.run_episode, itertools.count()

    def late(task, ctx, **options):
        wait = (episodes - 1 - next(calls) % episodes) * delay

        async def episode():
            await asyncio.sleep(wait)
            return await play(task, ctx, **options)
        return episode()

    monkeypatch.setattr(env, "run_episode", late)


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
    # raises its rollout's policy-gradient objective
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
    # each episode's seeds are its own, so this process drew the subprocess's rollouts
    for name in ("rollout/reward/verifiers", "loss"):
        assert [r[name] for r in recorded] == pytest.approx([r[name] for r in records],
                                                            rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_each_episode_samples_the_same_tokens_whatever_order_its_turns_arrive_in(
        tmp_path, monkeypatch):
    # the same seeded run twice in this process, the second one's episodes asking in
    # reverse order: every episode of every step samples the same tokens, log-probs and
    # rewards (its seeds are its own: the rollout's, its index in the rollout, its turn's)
    arrivals, respond = [], EngineClient.get_response

    async def arriving(self, dialect, body, sampling, session_id=None, **options):
        arrivals.append(session_id)
        return await respond(self, dialect, body, sampling, session_id=session_id, **options)

    monkeypatch.setattr(EngineClient, "get_response", arriving)
    drawn, orders = [], []
    for name, delay in (("first", 0.0), ("reversed", 0.5)):
        config = _config(tmp_path)
        config["output_dir"] = str(tmp_path / name)
        strategy, run = build_strategy(config, tmp_path)
        if delay:
            _reverse_arrivals(monkeypatch, run.episodes.env, 2 * GROUP, delay)
        drawn.append([batch for batch, _ in fit_recording_rollouts(strategy, run)])
        traces = [e.traces[0].id for e in run.episodes.last_episodes]
        orders.append([traces.index(t) for t in arrivals if t in traces])
    # the second run's episodes did ask in reverse (the middle two may swap under load)
    assert orders[1][0] == 3 and orders[1][-1] == 0, orders
    first, second = drawn
    assert len(first) == len(second) == 2
    for a, b in zip(first, second):
        assert a.completions == b.completions
        for field in ("prompt_ids", "response_ids", "response_mask", "rewards"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        # the same tokens, scored in batches the arrival order composed differently: equal
        # within the sampler = trainer bound, not to the bit
        assert torch.allclose(a.old_logprobs, b.old_logprobs, rtol=0, atol=1e-5)
    # and the seeds differ between the episodes of a group, and between the steps
    completions = [c for batch in first for c in batch.completions]
    assert len(set(completions)) > 2, completions


def test_an_environment_that_does_not_load_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError) as error:
        build_strategy(_config(tmp_path, env="verifiers_test_envs:nothing"), tmp_path)
    assert "environment.env" in str(error.value) and "nothing" in str(error.value)
