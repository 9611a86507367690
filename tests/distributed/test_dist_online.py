"""GRPO and PPO on 2 processes equal the 1-process runs: the same completions (seeded
sampling, each rank sampling its share of the prompts), the same metrics (global
advantage statistics, GAE whitening, token-weighted losses) and the same weights, up to
reduction order. The GRPO reward comes from a plugin given only through ASTRAI_PLUGINS,
which every process loads; the same plugin failing on rank 1 alone ends the job."""

from __future__ import annotations

import os
import re
import time

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
from tests.distributed.conftest import (adapter, assert_close_metrics, assert_close_weights,
                                        ok, train, weights)
from tests.training.reference import save_start_model

PLUGIN = '''
import os
from astrai_core import RewardFunctionSpec, hookimpl


@hookimpl
def astrai_reward_functions():
    return [RewardFunctionSpec(name="dist_digit", target="dist_reward_plugin:digit",
                               summary="1 when the completion has a digit")]


# Where CHUNK_LOG is set, each process notes every call of the chunked head (the test
# asserts that the sharded runs' log-probs came through it, not through full logits).
import astrai_core.model.head as _head

_chunked_logprobs = _head.chunked_logprobs


def _noting_chunked_logprobs(*args, **kwargs):
    if os.environ.get("CHUNK_LOG"):
        rank = "rank" + os.environ.get("RANK", "0")
        with open(os.path.join(os.environ["CHUNK_LOG"], rank), "a") as f:
            f.write("chunked_logprobs\\n")
    return _chunked_logprobs(*args, **kwargs)


_head.chunked_logprobs = _noting_chunked_logprobs


def digit(prompts, completions, **columns):
    if os.environ.get("EXPLODE_ON_RANK", "none") == os.environ.get("RANK"):
        raise RuntimeError("dist_digit exploded on rank " + os.environ["RANK"])
    if os.environ.get("REWARD_LOG"):  # how many completions each process scored
        with open(os.path.join(os.environ["REWARD_LOG"], os.environ.get("RANK", "0")), "a") as f:
            f.write(f"{len(completions)}\\n")
    return [float(any(ch.isdigit() for ch in text)) for text in completions]
'''
pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3
SHARED = ("loss", "policy_loss", "grad_norm", "tokens", "rollout/reward_mean",
          "rollout/advantage_mean", "rollout/advantage_std")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """ASTRAI_PLUGINS naming a module that only PYTHONPATH reaches."""
    directory = tmp_path_factory.mktemp("plugin")
    (directory / "dist_reward_plugin.py").write_text(PLUGIN)
    path = os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")])
    return {"ASTRAI_PLUGINS": "dist_reward_plugin", "PYTHONPATH": path}


def online_config(tmp, name: str, strategy: dict) -> dict:
    prompts = write_arith_prompts(tmp / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp, prompts, strategy, data={"batch_size": 4},
                             rewards=[{"name": "dist_digit"}], max_steps=STEPS,
                             save_every=1, lr=2e-3, eps=1e-6)
    # A tiny random policy has many near-zero gradients (equal rewards in a group give zero
    # advantages). Adam's first step is lr * g / (|g| + eps): with eps=1e-8 it turns the
    # 1e-9 reduction-order noise of such a gradient into a change of order lr; eps=1e-6
    # keeps that noise at its own size, so the tolerance tests the distributed maths.
    config["output_dir"] = str(tmp / name)
    config["parallel"] = {"timeout_seconds": 120}
    return config


STRATEGIES = {
    "grpo": {"name": "grpo", "group_size": 4, "mini_batches": 2, "kl_coef": 0.05},
    "ppo": {"name": "ppo", "group_size": 2, "epochs": 2, "mini_batches": 2},
}


@pytest.fixture(scope="module", params=sorted(STRATEGIES))
def pair(request, tmp_path_factory, plugin_env):
    """(strategy, 1-process run dir, 2-process run dir)."""
    tmp = tmp_path_factory.mktemp(request.param)
    for name, nproc in (("one", 1), ("two", 2)):
        (tmp / f"{name}_chunks").mkdir()
        ok(train(online_config(tmp, name, STRATEGIES[request.param]), tmp, name, nproc,
                 env={**plugin_env, "CHUNK_LOG": str(tmp / f"{name}_chunks")}))
    return request.param, tmp / "one", tmp / "two"


def _rollout(run_dir, step=1):
    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "state_tensors.safetensors"))


def test_same_completions(pair):
    """The rollout served at step 1 (saved mid-rollout): identical tokens and rewards."""
    _, one, two = pair
    a, b = _rollout(one), _rollout(two)
    for name in ("response_ids", "response_mask", "prompt_ids", "group_ids", "rewards"):
        assert torch.equal(a[name], b[name]), name
    assert torch.allclose(a["advantages"], b["advantages"], atol=1e-5)


def test_same_metrics_and_weights(pair):
    strategy, one, two = pair
    names = SHARED + (("value_loss", "critic/grad_norm") if strategy == "ppo" else ("kl",))
    assert_close_metrics(read_metrics(one), read_metrics(two), names, rtol=1e-4)
    assert_close_weights(weights(one, STEPS), weights(two, STEPS))
    if strategy == "ppo":
        assert_close_weights(weights(one, STEPS, "critic"), weights(two, STEPS, "critic"))


def test_every_rank_took_the_chunked_head(pair):
    """Log-probs of the sharded policy came from the chunked head, on both ranks."""
    _, one, two = pair
    for run, ranks in ((one, ["rank0"]), (two, ["rank0", "rank1"])):
        notes = run.parent / f"{run.name}_chunks"
        assert sorted(p.name for p in notes.iterdir()) == ranks
        assert all((notes / rank).read_text().count("\n") >= STEPS for rank in ranks)


def test_lora_grpo_with_kl_equals_one_process(tmp_path, plugin_env):
    """A LoRA policy whose KL reference is itself with the adapter disabled, sharded."""
    start = save_start_model(tmp_path / "start")
    for name, nproc in (("one", 1), ("two", 2)):
        config = online_config(tmp_path, name, STRATEGIES["grpo"])
        config["model"] = {"path": str(start), "lora": {"r": 4, "alpha": 8.0}}
        ok(train(config, tmp_path, name, nproc, env=plugin_env))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert_close_metrics(one, two, SHARED + ("kl",), rtol=1e-4)
    assert two[-1]["kl"] > 0  # the adapter moved the policy away from its reference
    assert_close_weights(adapter(tmp_path / "one", STEPS), adapter(tmp_path / "two", STEPS))


def test_failure_on_one_rank_ends_the_job(tmp_path, plugin_env):
    """rank 1's reward raises: the job exits non-zero, with rank 1's message printed once
    and repeated by the launcher, long before the process-group timeout."""
    config = online_config(tmp_path, "fails", STRATEGIES["grpo"])
    started = time.monotonic()
    result = train(config, tmp_path, "fails", 2, env={**plugin_env, "EXPLODE_ON_RANK": "1"})
    assert result.returncode != 0
    # printed once by the rank that raised (not again by its peer), and repeated in the
    # launcher's last line
    lines = [line for line in result.stderr.splitlines() if "dist_digit exploded on rank 1" in line]
    assert len(lines) == 2, result.stderr[-4000:]
    assert lines[0].startswith("error: [rank 1] reward 'dist_digit' raised"), lines
    # rank 1 is named with its own error, whether it had exited (status 2) or torchrun's
    # SIGTERM reached it while it was exiting
    assert re.match(r"error: the distributed run failed: rank 1 (exited with status 2|failed "
                    r"\(SIGTERM while it exited\)): reward 'dist_digit' raised", lines[1]), lines
    assert time.monotonic() - started < config["parallel"]["timeout_seconds"]
