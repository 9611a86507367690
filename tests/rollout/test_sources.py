"""The rollout source owns the online schedule: one draw per epochs x mini_batches steps,
a fresh shuffle per epoch, equal micro-batches, and a checkpoint state that resumes inside
a rollout exactly where it stopped."""

from __future__ import annotations

import torch

from astrai_core.online.source import RolloutSource
from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner
from astrai_core.sampling import SamplingParams
from astrai_core.training.batch_sources import TENSORS

PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0)


class Prompts:
    """A re-iterable, resumable prompt source (as the data loaders are)."""

    def __init__(self, records):
        self.records, self.start = records, 0

    def __iter__(self):
        for index in range(self.start, len(self.records)):
            self.start = index + 1
            yield self.records[index]
        self.start = 0

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


def _source(fake_sampler, make_records, **schedule):
    runner = RolloutRunner(fake_sampler, tokenizer=None,
                           rewards=RewardSet.from_config([{"name": "exact_match"}]),
                           sampling_params=PARAMS, group_size=2, prompts_per_rollout=2,
                           prompt_source=Prompts(make_records(range(10))))
    processed = []

    def process(rollout):
        rollout.advantages = rollout.rewards[:, None].expand_as(rollout.old_logprobs).clone()
        processed.append(rollout)
        return rollout, {"rollout/marker": float(len(processed))}

    options = dict(epochs=2, mini_batches=2, micro_batches=1, seed=0)
    options.update(schedule)
    return RolloutSource(runner, process, **options), processed


def _rows(micro_batches):
    return sorted(int(i) for mb in micro_batches for i in mb.prompt_ids[:, 0])


def test_each_rollout_serves_epochs_times_mini_batches_steps(fake_sampler, make_records):
    source, processed = _source(fake_sampler, make_records)
    steps = [source.next_step() for _ in range(8)]
    assert len(processed) == 2 and len(fake_sampler.calls) == 2   # 2 x 2 steps per rollout
    padding = source.stats.pop("throughput/padding_fraction")  # of the step's micro-batches
    assert source.stats == {"rollout/marker": 2.0, "rollout/staleness": 0.0}
    step = steps[-1][0]
    assert padding == 1 - step.attention_mask().sum().item() / step.attention_mask().numel()
    # each epoch (2 mini-batch steps) covers the whole rollout once: prompts 0 and 1 twice each
    first_epoch = _rows(steps[0] + steps[1])
    assert first_epoch == [0, 0, 1, 1]
    assert _rows(steps[2] + steps[3]) == first_epoch
    assert _rows(steps[4] + steps[5]) == [2, 2, 3, 3]            # the second rollout


def test_micro_batches_split_each_step_equally(fake_sampler, make_records):
    source, _ = _source(fake_sampler, make_records, epochs=1, mini_batches=1, micro_batches=2)
    step = source.next_step()
    assert [len(mb) for mb in step] == [2, 2]


def test_state_inside_a_rollout_resumes_the_same_remaining_steps(fake_sampler, make_records):
    source, _ = _source(fake_sampler, make_records)
    source.next_step()
    state = source.state_dict()
    assert state["position"] == 1 and set(state[TENSORS]) >= {"response_ids", "advantages"}
    rest = [source.next_step() for _ in range(5)]

    resumed, processed = _source(fake_sampler, make_records)
    resumed.load_state_dict(state)
    again = [resumed.next_step() for _ in range(5)]
    assert len(processed) == 1    # the interrupted rollout was restored, not drawn again
    for a, b in zip(rest, again, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.response_ids, y.response_ids)
            assert torch.equal(x.advantages, y.advantages)
            assert torch.equal(x.old_logprobs, y.old_logprobs)
