"""parallel.context_parallel for online strategies: GRPO (with its KL reference, padded and
packed micro-batches, recomputed old log-probs) and PPO (with its critic) whose rollout
rows are split over a context group of 2 equal the one-process runs: the same rollout,
the same metrics (token counts included: a group's rows count once) and the same
weights."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.testing import read_metrics
from tests.distributed.conftest import assert_close_metrics, assert_close_weights, ok, train, weights
from tests.distributed.test_dist_online import STEPS, _rollout, online_config, plugin_env  # noqa: F401

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
SHARED = ("loss", "policy_loss", "grad_norm", "tokens", "rollout/reward_mean",
          "rollout/advantage_mean", "rollout/advantage_std", "entropy")

CASES = {
    "grpo": ({"name": "grpo", "group_size": 4, "mini_batches": 2, "kl_coef": 0.05,
              "recompute_old_logprobs": True}, {}),
    "grpo-packed": ({"name": "grpo", "group_size": 4, "mini_batches": 2, "kl_coef": 0.05},
                    {"micro_batch_tokens": 96}),
    "ppo": ({"name": "ppo", "group_size": 2, "epochs": 2, "mini_batches": 2}, {}),
}


def _run(tmp, name, case, nproc, env, **parallel):
    strategy, trainer = CASES[case]
    config = online_config(tmp, name, strategy)
    config["trainer"].update(trainer)
    config["parallel"].update(parallel)
    config["sampler"]["max_new_tokens"] = 13  # rows of odd and differing lengths
    done = train(config, tmp, name, nproc, env=env)
    ok(done)
    return done


@pytest.mark.parametrize("case", sorted(CASES))
def test_context_parallel_online_equals_one_process(tmp_path, plugin_env, case):
    _run(tmp_path, "one", case, 1, plugin_env)
    (tmp_path / "scored").mkdir()
    done = _run(tmp_path, "cp", case, 2, {**plugin_env, "REWARD_LOG": str(tmp_path / "scored")},
                context_parallel=2)
    events = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()
              if line.startswith("{")]
    assert [e["context_parallel"] for e in events if e.get("event") == "distributed"] == [2]
    # the ranks of the group split its prompts: each sampled and scored half of them
    group_size = CASES[case][0]["group_size"]
    for rank in ("0", "1"):
        scored = (tmp_path / "scored" / rank).read_text().split()
        assert set(scored) == {str(4 * group_size // 2)}, (rank, scored)
    one, cp = tmp_path / "one", tmp_path / "cp"
    a, b = _rollout(one), _rollout(cp)
    for name in ("response_ids", "response_mask", "prompt_ids", "group_ids", "rewards"):
        assert torch.equal(a[name], b[name]), name
    for name in ("old_logprobs", "ref_logprobs", "values", "advantages"):
        if name in a:
            assert torch.allclose(a[name], b[name], atol=1e-5), name
    names = SHARED + (("value_loss", "critic/grad_norm") if case == "ppo" else ("kl",))
    assert_close_metrics(read_metrics(one), read_metrics(cp), names, rtol=1e-4)
    assert_close_weights(weights(one, STEPS), weights(cp, STEPS))
    if case == "ppo":
        assert_close_weights(weights(one, STEPS, "critic"), weights(cp, STEPS, "critic"))


@pytest.mark.parametrize("strategy, trainer, message", [
    ({"router_replay": "R2"}, {}, "parallel.context_parallel: cannot replay MoE routing"),
    ({}, {"share_prompt": True}, "parallel.context_parallel: splits each row's tokens over "
     "ranks, and trainer.share_prompt"),
])
def test_the_plan_refuses_what_it_cannot_split(tmp_path, plugin_env, strategy, trainer,
                                               message):
    config = online_config(tmp_path, "refused", {**CASES["grpo"][0], **strategy})
    config["trainer"].update(trainer)
    config["parallel"]["context_parallel"] = 2
    done = train(config, tmp_path, "refused", 2, env=plugin_env)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], done.stderr[-3000:]


def test_two_data_groups_of_two_equal_one_process(tmp_path, plugin_env):
    """4 processes, 2 data-parallel groups of 2: each group samples its own prompts, the
    rollout holds each group's rows once, in the one-process order."""
    _run(tmp_path, "one", "grpo", 1, plugin_env)
    _run(tmp_path, "dp2cp2", "grpo", 4, plugin_env, context_parallel=2)
    one, mesh = tmp_path / "one", tmp_path / "dp2cp2"
    a, b = _rollout(one), _rollout(mesh)
    for name in ("response_ids", "prompt_ids", "group_ids", "rewards"):
        assert torch.equal(a[name], b[name]), name
    assert_close_metrics(read_metrics(one), read_metrics(mesh), SHARED + ("kl",), rtol=1e-4)
    assert_close_weights(weights(one, STEPS), weights(mesh, STEPS))
