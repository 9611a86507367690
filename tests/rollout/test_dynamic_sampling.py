"""DAPO dynamic sampling: rollouts filled with informative groups, and a bounded search.

The fake sampler answers "2v" then "wrong" for prompt [v]; a record whose answer column
is not 2v therefore earns 0 on both completions: a uniform group. The exact-match reward
makes every other group informative ([1, 0]).
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner
from astrai_core.rollout.dynamic_sampling import DynamicSampler, informative_groups
from astrai_core.sampling import SamplingParams


def _records(values, informative):
    """Prompt [v] per value; informative(v) decides whether its group's rewards differ."""
    return [{"prompt_ids": [v], "prompt_text": f"q{v}",
             "columns": {"answer": str(2 * v) if informative(v) else "none"}} for v in values]


def _runner(sampler, source, prompts=4):
    return RolloutRunner(sampler, tokenizer=None,
                         rewards=RewardSet.from_config([{"name": "exact_match"}]),
                         sampling_params=SamplingParams(max_new_tokens=4, temperature=1.0),
                         group_size=2, prompt_source=source, prompts_per_rollout=prompts)


def test_groups_with_equal_rewards_are_found(fake_sampler):
    rollout = _runner(fake_sampler, _records(range(4), lambda v: v % 2 == 0)).draw()
    good, uniform = informative_groups(rollout)
    assert [rows.tolist() for rows in good] == [[0, 1], [4, 5]]
    assert [rows.tolist() for rows in uniform] == [[2, 3], [6, 7]]


def test_dynamic_sampling_fills_the_rollout_with_informative_groups(fake_sampler):
    runner = _runner(fake_sampler, _records(range(12), lambda v: v % 2 == 0))
    sampler = DynamicSampler(runner, groups=4, max_tries=5)
    rollout = sampler.draw()
    # two draws of 4 prompts each; the odd (uniform) ones are dropped
    assert runner.rollouts_drawn == 2
    assert rollout.prompts == ["q0", "q0", "q2", "q2", "q4", "q4", "q6", "q6"]
    assert rollout.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rollout.rewards.tolist() == [1.0, 0.0] * 4
    # rows re-padded to one width, exactly as the runner built them
    assert rollout.response_ids.tolist()[:2] == [[10, 0], [10, 10]]
    assert rollout.response_mask.sum(1).tolist() == [1, 2] * 4
    assert rollout.old_logprobs.tolist()[:2] == [[-0.5, 0.0], [-0.5, -1.0]]
    assert rollout.prompt_mask.all() and rollout.prompt_ids[:, 0].tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    assert all(len(g) == 2 for g in informative_groups(rollout)[0])
    assert sampler.stats == {"rollout/dynamic_sampling_tries": 2.0,
                             "rollout/informative_groups": 4.0,
                             "rollout/dynamic_sampling_filled": 0.0,
                             "rollout/dropped_group_fraction": 0.5}


def test_a_surplus_of_informative_groups_is_dropped(fake_sampler):
    runner = _runner(fake_sampler, _records(range(12), lambda v: v in (0, 4, 5, 6)))
    rollout = DynamicSampler(runner, groups=2, max_tries=5).draw()
    # draw 1 (q0..q3) yields q0, draw 2 (q4..q7) yields q4, q5, q6: q5 and q6 are spent
    assert rollout.prompts[::2] == ["q0", "q4"] and runner.rollouts_drawn == 2
    assert runner.draw().prompts[0] == "q8"


def test_dynamic_sampling_gives_up_after_max_tries_with_its_metric(fake_sampler):
    runner = _runner(fake_sampler, _records(range(40), lambda v: v == 1))
    sampler = DynamicSampler(runner, groups=4, max_tries=3)
    with capture_logs() as logs:
        rollout = sampler.draw()
    assert runner.rollouts_drawn == 3                 # bounded: never more than max_tries
    assert sampler.stats["rollout/dynamic_sampling_tries"] == 3.0
    assert sampler.stats["rollout/informative_groups"] == 1.0
    assert sampler.stats["rollout/dynamic_sampling_filled"] == 3.0
    assert sampler.stats["rollout/dropped_group_fraction"] == pytest.approx(11 / 12)
    warning = [e for e in logs if e["log_level"] == "warning"]
    assert warning and warning[0]["event"] == "dynamic sampling gave up"
    # the rollout keeps its shape: the informative group, then uniform ones in draw order
    assert len(rollout) == 8 and rollout.prompts[::2] == ["q1", "q0", "q2", "q3"]
    assert rollout.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]



def test_dynamic_sampling_options_are_validated():
    from pydantic import ValidationError

    from astrai_core.config.online import OnlineConfig

    assert OnlineConfig(group_size=2, dynamic_sampling={"max_tries": 3}).dynamic_sampling.max_tries == 3
    with pytest.raises(ValidationError, match="group_size >= 2"):
        OnlineConfig(group_size=1, dynamic_sampling={})
    with pytest.raises(ValidationError, match="max_tries"):
        OnlineConfig(dynamic_sampling={"max_tries": 0})
    OnlineConfig(group_size=1, dynamic_sampling={"enabled": False})  # off: no constraint
