"""RolloutSource with rollout.max_staleness: k requests rollouts ahead so that none is ever
more than k optimizer steps old, and as early as that bound allows (a fake drawer whose
policy version the test advances once per step, as the trainer's publish does)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.rollout.batch import RolloutBatch
from astrai_core.online.source import RolloutSource


class FakeDrawer:
    def __init__(self) -> None:
        self.policy_version = 0
        self.requested: list[int] = []  # the policy version of each request, in order

    def _rollout(self, version: int) -> RolloutBatch:
        ones = torch.ones(6, 2, dtype=torch.bool)
        return RolloutBatch(prompt_ids=torch.ones(6, 2, dtype=torch.long), prompt_mask=ones,
                            response_ids=torch.ones(6, 2, dtype=torch.long), response_mask=ones,
                            old_logprobs=torch.zeros(6, 2), rewards=torch.zeros(6),
                            reward_components={}, group_ids=torch.zeros(6, dtype=torch.long),
                            policy_version=version)

    def draw(self) -> RolloutBatch:
        self.requested.append(self.policy_version)
        return self._rollout(self.policy_version)

    def submit(self):
        version = self.policy_version
        self.requested.append(version)
        return type("Pending", (), {"result": lambda _: self._rollout(version)})()

    def state_dict(self):
        return {}

    def load_state_dict(self, state) -> None:
        pass


def _staleness(k: int, steps_per_rollout: int, steps: int) -> tuple[list[float], FakeDrawer]:
    drawer = FakeDrawer()
    source = RolloutSource(drawer, lambda r: (r, {}), epochs=1, mini_batches=steps_per_rollout,
                           micro_batches=1, seed=0, max_staleness=k)
    seen = []
    for _ in range(steps):
        source.next_step()
        seen.append(source.stats["rollout/staleness"])
        drawer.policy_version += 1  # the trainer publishes after every optimizer step
    return seen, drawer


@pytest.mark.parametrize("steps_per_rollout", [1, 2, 3])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_no_rollout_is_older_than_k_steps(k, steps_per_rollout):
    seen, drawer = _staleness(k, steps_per_rollout, steps=12)
    assert max(seen) <= k
    assert seen[-1] == k  # once the pipeline is full, requested as early as k allows
    if k == 0:
        assert seen == [0.0] * 12 and len(drawer.requested) == 12 // steps_per_rollout


def test_one_step_off():
    seen, drawer = _staleness(1, 1, steps=5)
    assert seen == [0, 1, 1, 1, 1]
    assert drawer.requested == [0, 0, 1, 2, 3, 4]  # rollout t+1 requested before step t


def test_two_steps_per_rollout_request_the_next_after_the_first_step():
    seen, drawer = _staleness(1, 2, steps=6)
    assert seen == [0, 0, 1, 1, 1, 1]
    assert drawer.requested == [0, 1, 3, 5]
