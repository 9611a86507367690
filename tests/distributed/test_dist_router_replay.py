"""R3 router replay on 2 processes equals the 1-process run: each rank's rollout carries
its sampler's routing, re-padded to the widest rank when the rollout is gathered (and
gathered as int32: gloo has no int16), so the training forwards replay the right
experts on every row. The weights are not compared: an MoE policy's 2-process weights
differ from the 1-process ones by ~1e-3 after a step with or without replay (measured),
probably because each rank's load-balancing loss sees only its own tokens."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.model.router_replay import ROUTED_EXPERTS
from astrai_core.testing import read_metrics
from tests.distributed.conftest import assert_close_metrics, ok, train
from tests.distributed.test_dist_online import online_config, plugin_env  # noqa: F401
from tests.rl.test_router_replay import MOE

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun


def test_r3_on_two_processes_equals_one(tmp_path, plugin_env):  # noqa: F811
    for name, nproc in (("one", 1), ("two", 2)):
        config = online_config(tmp_path, name, {"name": "grpo", "group_size": 4,
                                                "mini_batches": 2, "router_replay": "R3"})
        config["model"]["config"].update(MOE)
        ok(train(config, tmp_path, name, nproc, env=plugin_env))
    # the global rollout of step 1 (saved mid-rollout): the same routing on every row
    rollouts = [load_file(str(tmp_path / name / "checkpoints" / "step_1" /
                              "state_tensors.safetensors")) for name in ("one", "two")]
    key = f"extras.{ROUTED_EXPERTS}"
    assert rollouts[1][key].dtype == torch.int16
    assert torch.equal(rollouts[0][key], rollouts[1][key])
    assert torch.equal(rollouts[0]["response_ids"], rollouts[1]["response_ids"])
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    # MoE routing amplifies the reduction-order noise of the first update a little
    assert_close_metrics(one, two, ("loss", "policy_loss", "grad_norm"), rtol=1e-3)
    # each rollout's first step replays the routing that sampled it, on every rank
    assert [m["router/replay_mismatch"] for m in two if "loss" in m][0::2] == [0.0, 0.0]
