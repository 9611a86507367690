"""The rollout runner: groups, rewards, validation, publishing (the schedule: test_sources.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from astrai_core.errors import DataError
from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner
from astrai_core.rollout.records import as_prompt_record
from astrai_core.sampling import SamplingParams

PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0)


def runner_for(sampler, source, **kwargs):
    options = dict(group_size=3, prompts_per_rollout=2)
    options.update(kwargs)
    return RolloutRunner(sampler, tokenizer=None, rewards=RewardSet.from_config([{"name": "exact_match"}]),
                         sampling_params=PARAMS, prompt_source=source, **options)


def test_rollout_has_group_size_completions_per_prompt_with_group_ids(fake_sampler, make_records):
    batch = runner_for(fake_sampler, make_records([4, 7])).draw()
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.prompts == ["q4"] * 3 + ["q7"] * 3
    assert [c["answer"] for c in batch.columns] == ["8"] * 3 + ["14"] * 3
    assert batch.completions == ["8", "wrong", "8", "14", "wrong", "14"]
    assert batch.rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert batch.reward_components["exact_match"].tolist() == batch.rewards.tolist()
    assert batch.response_mask.sum(1).tolist() == [1, 2, 3, 1, 2, 3]   # right-padded
    assert batch.response_ids[1].tolist() == [14, 14, 0] and batch.response_mask[1].tolist() == [True, True, False]
    assert batch.old_logprobs[1].tolist() == [-0.5, -1.0, 0.0]        # 0 on padding
    assert all(p.n == 3 for p in fake_sampler.calls[0][1])


def test_one_off_rollout_leaves_the_training_prompts_alone(fake_sampler, make_records):
    runner = runner_for(fake_sampler, make_records(range(10)))
    first = runner.draw()
    one_off = [as_prompt_record(record) for record in make_records([42])]
    validation = runner.rollout(one_off, group_size=1)
    assert validation.group_ids.tolist() == [0] and validation.prompts == ["q42"]
    assert runner.rollouts_drawn == 1 and first.prompts[0] == "q0"
    second = runner.draw()
    assert second.prompts[0] == "q2"                 # the prompt stream was not consumed


class _WatchedLock:
    """The runner's lock, reporting when another thread starts waiting for it (the one
    internal this test reaches: ``RolloutRunner._lock``)."""

    def __init__(self, lock):
        self._lock = lock
        self.contended = threading.Event()

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            self.contended.set()       # held by someone else: we are about to block
            self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def test_publish_bumps_the_version_between_rollouts_never_during_one(fake_sampler, make_records):
    runner = runner_for(fake_sampler, make_records(range(10)))
    assert runner.draw().policy_version == 0
    assert runner.publish() == 1
    watched = runner._lock = _WatchedLock(runner._lock)
    publisher = threading.Thread(target=runner.publish)
    versions_seen_while_sampling = []

    def publish_while_sampling():
        publisher.start()
        # Wait (on an event, not the clock) until the publisher is blocked on the lock...
        assert watched.contended.wait(timeout=60), "publish never tried to take the lock"
        # ...and check it has not changed the weights under the running rollout.
        versions_seen_while_sampling.append(fake_sampler.policy_version)

    fake_sampler.during_generate = publish_while_sampling
    assert runner.draw().policy_version == 1
    publisher.join()
    fake_sampler.during_generate = None
    assert versions_seen_while_sampling == [1]
    assert fake_sampler.policy_version == 2          # the publish went through afterwards
    assert runner.draw().policy_version == 2


def test_prompt_source_restarts_each_epoch_and_an_iterator_that_ends_is_an_error(fake_sampler, make_records):
    runner = runner_for(fake_sampler, make_records([1, 2, 3]))
    assert [runner.draw().prompts[0] for _ in range(3)] == ["q1", "q3", "q2"]
    with pytest.raises(DataError, match="yields no prompts"):
        once = runner_for(fake_sampler, iter(make_records([1, 2])))
        once.draw()
        once.draw()


def test_seeded_rollouts_differ_from_each_other_and_reproduce(fake_sampler, make_records):
    seeded = PARAMS.model_copy(update={"seed": 5})
    for _ in range(2):
        runner = runner_for(fake_sampler, make_records(range(4)))
        runner.sampling_params = seeded
        runner.draw()
        runner.draw()
    seeds = [[p.seed for p in call[1]] for call in fake_sampler.calls]
    assert seeds[0] == seeds[2] and seeds[1] == seeds[3]
    assert len({*seeds[0], *seeds[1]}) == 4


def test_batch_views_select_split_and_extras(fake_sampler, make_records):
    batch = runner_for(fake_sampler, make_records([4, 7])).draw()
    batch.prompt_ids = torch.tensor([[0, 4]] * 3 + [[5, 7]] * 3)  # row group 0: one pad on the left
    batch.prompt_mask = torch.tensor([[False, True]] * 3 + [[True, True]] * 3)
    batch.extras["advantages"] = torch.arange(6.0)[:, None].expand(6, 3)
    assert batch.input_ids()[1].tolist() == [0, 4, 14, 14, 0]
    assert batch.attention_mask()[1].tolist() == [0, 1, 1, 1, 0]
    assert batch.position_ids()[1].tolist()[1:4] == [0, 1, 2]
    assert batch.position_ids()[4].tolist()[:4] == [0, 1, 2, 3]
    picked = batch.select([5, 0])
    assert picked.group_ids.tolist() == [1, 0] and picked.completions == ["14", "8"]
    assert picked.extras["advantages"][:, 0].tolist() == [5.0, 0.0]
    assert picked.reward_components["exact_match"].tolist() == [1.0, 1.0]
    parts = batch.split(4)
    assert [len(p) for p in parts] == [4, 2] and parts[1].prompts == ["q7", "q7"]
    assert torch.equal(torch.cat([p.response_ids for p in parts]), batch.response_ids)
    assert batch.to("cpu").rewards.tolist() == batch.rewards.tolist()
