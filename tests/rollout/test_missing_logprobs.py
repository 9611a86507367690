"""A sampler without (complete) log-probs: the rollout says so (old_logprobs None), and an
online run either stops with a clear error or takes the old policy from the trainer."""

from __future__ import annotations

import pytest
import torch

from astrai_core.errors import ConfigError
from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner
from astrai_core.sampling import SamplingParams
from astrai_core.testing import (build_strategy, read_metrics, tiny_run_config,
                                 write_arith_prompts)
from astrai_core.training.trainer import Trainer


def _damage_logprobs(sampler, damage) -> None:
    """Make ``sampler.generate`` pass every completion's log-probs through ``damage``."""
    generate = sampler.generate

    def damaged(*args, **kwargs):
        completions = generate(*args, **kwargs)
        for index, completion in enumerate(completions):
            completion.logprobs = damage(index, completion.logprobs)
        return completions
    sampler.generate = damaged


# Completions of the fake sampler have 1, 2, 3 tokens; one bad row spoils the whole batch.
MISSING = {
    "none everywhere": lambda index, logprobs: None,
    "empty everywhere": lambda index, logprobs: [],
    "none in one row": lambda index, logprobs: None if index == 4 else logprobs,
    "one short row": lambda index, logprobs: logprobs[:-1] if index == 2 else logprobs,
}


def _rollout(sampler, make_records):
    runner = RolloutRunner(sampler, tokenizer=None,
                           rewards=RewardSet.from_config([{"name": "exact_match"}]),
                           sampling_params=SamplingParams(max_new_tokens=4), group_size=3,
                           prompt_source=make_records([4, 7]), prompts_per_rollout=2)
    return runner.draw()


@pytest.mark.parametrize("damage", MISSING.values(), ids=MISSING.keys())
def test_incomplete_logprobs_give_no_old_logprobs(fake_sampler, make_records, damage):
    _damage_logprobs(fake_sampler, damage)
    batch = _rollout(fake_sampler, make_records)
    assert batch.old_logprobs is None
    assert batch.response_mask.sum(1).tolist() == [1, 2, 3, 1, 2, 3]  # the rest is intact
    assert batch.rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    # Row views keep the field absent.
    assert batch.select([5, 0]).old_logprobs is None
    assert [p.old_logprobs for p in batch.split(4)] == [None, None]
    moved = batch.to("cpu")
    assert moved.old_logprobs is None and torch.equal(moved.response_ids, batch.response_ids)


def test_complete_logprobs_are_kept_and_padded_with_zeros(fake_sampler, make_records):
    batch = _rollout(fake_sampler, make_records)
    assert batch.old_logprobs[2].tolist() == [-0.5, -1.0, -1.5]
    assert batch.old_logprobs[3].tolist() == [-0.5, 0.0, 0.0]
    assert batch.select([3]).old_logprobs.tolist() == [[-0.5, 0.0, 0.0]]


def _online(tmp_path, recompute: bool, damage, epochs: int = 1):
    """A grpo strategy (found by name) whose sampler's log-probs are damaged."""
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, {
        "name": "grpo", "group_size": 2, "recompute_old_logprobs": recompute, "epochs": epochs},
        data={"batch_size": 4}, sampler={"temperature": 0.8}, max_steps=2)
    strategy, run = build_strategy(config, tmp_path)
    _damage_logprobs(run.sampler, damage)  # built once: the runner samples with it
    return strategy, run


@pytest.mark.parametrize("damage", [MISSING["none everywhere"], MISSING["none in one row"]],
                         ids=["none everywhere", "none in one row"])
def test_without_recompute_the_run_stops_with_a_clear_error(tmp_path, damage):
    strategy, _ = _online(tmp_path, recompute=False, damage=damage)
    with pytest.raises(ConfigError, match=r"no behaviour log-probs.*"
                                          r"strategy\.recompute_old_logprobs: true"):
        strategy.batch_source().next_step()


@pytest.mark.parametrize("damage", [MISSING["none everywhere"], MISSING["one short row"]],
                         ids=["none everywhere", "one short row"])
def test_with_recompute_the_old_logprobs_are_the_trainers(tmp_path, damage):
    from astrai_core.testing import reference_token_logprobs

    # 2 epochs: a no-grad forward recomputes them once per rollout (with one step per
    # rollout the training forward supplies them: test_grpo_strategy.py)
    strategy, run = _online(tmp_path, recompute=True, damage=damage, epochs=2)
    source = strategy.batch_source()
    micro = source.next_step()[0]
    expected = torch.cat(reference_token_logprobs(run.model, micro, temperature=0.8))
    mask = micro.response_mask
    torch.testing.assert_close(micro.old_logprobs[mask].double(), expected, rtol=0, atol=1e-5)
    assert (micro.old_logprobs[~mask] == 0).all()
    assert "rollout/logprob_diff_max" not in source.stats  # nothing to compare
    assert "rollout/reward_mean" in source.stats


def test_a_run_with_recompute_trains_from_trainer_logprobs(tmp_path):
    strategy, run = _online(tmp_path, recompute=True, damage=MISSING["none everywhere"])
    trainer = Trainer(run, strategy)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    trainer.fit()
    metrics = [m for m in read_metrics(tmp_path / "run") if "ratio_max" in m]
    assert [m["step"] for m in metrics] == [1, 2]
    # One optimizer step per rollout: the old policy is the policy itself, so the ratio is 1.
    assert all(m["ratio_max"] == pytest.approx(1.0, abs=1e-5) for m in metrics)
    assert not any("rollout/logprob_diff_max" in m for m in metrics)
    assert any(not torch.equal(before[k], v) for k, v in run.model.state_dict().items())
