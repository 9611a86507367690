"""trainer.micro_batch_tokens on 2 processes: each rank packs its share of every packed
micro-batch (several per step here), and the run equals the 1-process padded one: the
same losses, gradient norms and weights (the loss weights make them independent of how
rows are cut into micro-batches), GRPO and PPO with its critic."""

from __future__ import annotations

import pytest

from astrai_core.testing import read_metrics
from tests.distributed.conftest import assert_close_metrics, assert_close_weights, ok, train, weights
from tests.distributed.test_dist_online import STEPS, STRATEGIES, online_config, plugin_env  # noqa: F401

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
BUDGET = 30  # tokens per rank: rows of ~12 tokens, 2 per micro-batch and rank
SAME = ("loss", "grad_norm", "tokens", "rollout/reward_mean", "rollout/advantage_mean",
        "rollout/advantage_std")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_packed_two_processes_equal_padded_one_process(tmp_path, plugin_env, strategy):  # noqa: F811
    for name, nproc, trainer in (("padded", 1, {}), ("packed", 2, {"micro_batch_tokens": BUDGET})):
        config = online_config(tmp_path, name, STRATEGIES[strategy])
        config["trainer"].update(trainer)
        ok(train(config, tmp_path, name, nproc, env=plugin_env))
    padded, packed = read_metrics(tmp_path / "padded"), read_metrics(tmp_path / "packed")
    assert all(r["throughput/padding_fraction"] == 0.0 for r in packed if "loss" in r)
    names = SAME + (("value_loss", "critic/grad_norm") if strategy == "ppo" else ())
    assert_close_metrics(padded, packed, names, rtol=1e-4)
    assert_close_weights(weights(tmp_path / "padded", STEPS), weights(tmp_path / "packed", STEPS))
    if strategy == "ppo":
        assert_close_weights(weights(tmp_path / "padded", STEPS, "critic"),
                             weights(tmp_path / "packed", STEPS, "critic"))
