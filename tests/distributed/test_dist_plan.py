"""The plan checks a run for the world size it will have, before any process group
exists: one error naming the field. And the in-process pieces of the distributed engine
(reductions of a step's metrics, rank shares of a batch) against hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.distributed.context import DistContext
from astrai_core.distributed.metrics import MicroBatchRecord, reduce_micro_batches
from astrai_core.errors import ConfigError
from astrai_core.testing import tiny_run_config, write_arith_prompts
from tests.training.conftest import tiny_config


def _plan_error(config: dict, tmp_path, monkeypatch, world: int) -> str:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(ConfigError) as error:
        plan_run(RunConfig.model_validate(config), base_dir=tmp_path)
    return str(error.value)


def test_a_global_batch_that_does_not_split_is_a_config_error(tmp_path, monkeypatch):
    config = tiny_config(tmp_path)
    config["data"]["batch_size"] = 3
    message = _plan_error(config, tmp_path, monkeypatch, 2)
    assert message.startswith("data.batch_size: the global batch of 3 cannot be split "
                              "evenly over 2"), message


@pytest.mark.parametrize("parallel, field", [({"dp_replicate": 3}, "parallel.dp_replicate"),
                                             ({"dp_shard": 4}, "parallel.dp_shard")])
def test_a_mesh_that_does_not_fit_the_world_is_a_config_error(tmp_path, monkeypatch,
                                                              parallel, field):
    config = dict(tiny_config(tmp_path), parallel=parallel)
    assert _plan_error(config, tmp_path, monkeypatch, 2).startswith(f"{field}: ")


def test_an_online_micro_batch_must_split_over_the_ranks(tmp_path, monkeypatch):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 1,
                                                 "mini_batches": 4},
                             data={"batch_size": 4})
    message = _plan_error(config, tmp_path, monkeypatch, 2)
    assert message.startswith("trainer.grad_accum_steps: a micro-batch of 1 sequences "
                              "cannot be split evenly over 2"), message


@pytest.mark.parametrize("world", [None, "1"], ids=["no torchrun", "torchrun of one"])
def test_the_same_config_plans_on_one_process(tmp_path, monkeypatch, world):
    """The batch of 3 that 2 ranks refuse is planned as given on one process, unchanged."""
    config = tiny_config(tmp_path)
    config["data"]["batch_size"] = 3
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    given = RunConfig.model_validate(config)
    plan = plan_run(given, base_dir=tmp_path)
    assert plan.config.data.batch_size == 3
    assert plan.config.model_dump() == given.model_dump()  # nothing rewritten to fit
    assert (plan.strategy.name, plan.device.name, plan.sampler.name) == ("sft", "cpu", "torch")
    assert plan.needs.data_formats == ("chat", "prompt_completion", "text") and not plan.needs.rollouts
    assert plan.advantage is None and plan.policy_loss is None and plan.rewards == ()


class FakeTwoRanks(DistContext):
    """Rank 0 of two, whose peer reported ``peer`` (the sum is taken here)."""

    def __init__(self, peer: list[MicroBatchRecord]) -> None:
        super().__init__(rank=0, world_size=2)
        object.__setattr__(self, "peer", peer)

    def all_gather_object(self, obj):
        return [obj, [sorted(r.metrics) for r in self.peer]]

    def all_reduce_sum(self, values):
        theirs = []
        names = sorted(self.peer[0].metrics)
        for r in self.peer:
            w = 1.0 if r.weight is None else r.weight
            theirs += [w, r.loss * w] + [r.metrics[n] * (1 if n == "tokens" else w)
                                         for n in names]
        return [a + b for a, b in zip(values, theirs)]


def test_metrics_are_weighted_by_each_ranks_share():
    """Rank 0: 3 tokens at mean loss 1.0; rank 1: 1 token at 5.0 -> global mean 2.0."""
    mine = [MicroBatchRecord(1.0, 3.0, {"tokens": 3, "kl": 0.1})]
    peer = [MicroBatchRecord(5.0, 1.0, {"tokens": 1, "kl": 0.5})]
    (reduced,) = reduce_micro_batches(mine, FakeTwoRanks(peer))
    assert reduced.loss == pytest.approx(2.0)
    assert reduced.weight == 4.0
    assert reduced.metrics["tokens"] == 4 and isinstance(reduced.metrics["tokens"], int)
    assert reduced.metrics["kl"] == pytest.approx((0.1 * 3 + 0.5 * 1) / 4)


def test_each_rank_takes_its_contiguous_share_of_rows():
    batch = {"input_ids": torch.arange(8).reshape(4, 2)}
    second = DistContext(rank=1, world_size=2).shard_rows(batch)
    assert second["input_ids"].tolist() == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="3 rows cannot be split evenly over 2"):
        DistContext(rank=0, world_size=2).shard_rows([1, 2, 3])
