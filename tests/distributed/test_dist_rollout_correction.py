"""Rollout correction with one optimizer step per rollout on 2 processes: the no-grad
forward is left to the training forward, each rank weighs its share of every micro-batch,
and the step's ``rollout_correction/*`` and ``rollout/logprob_diff_*`` metrics are those of
every rank's tokens: the 2-process run equals the 1-process one (whose deferred step
equals the step with the no-grad forward: tests/training/test_one_forward_per_rollout.py)."""

from __future__ import annotations

import os

import pytest

from astrai_core.testing import read_metrics
from tests.distributed.conftest import assert_close_metrics, assert_close_weights, ok, train, weights
from tests.distributed.test_dist_online import STEPS, online_config, plugin_env  # noqa: F401
from tests.training.conftest import PLUGIN as PERTURBED_PLUGIN

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
CORRECTION = "rollout_correction/"
SAME = ("loss", "grad_norm", "tokens", "rollout/logprob_diff_max", "rollout/logprob_diff_mean",
        CORRECTION + "weight_mean", CORRECTION + "weight_max", CORRECTION + "kl")


@pytest.mark.parametrize("correction", [
    {"level": "token", "mode": "truncate", "threshold": 1.2},
    {"level": "sequence", "mode": "mask", "threshold": 1.1},
], ids=["token truncate", "sequence mask"])
def test_deferred_correction_on_two_processes_equals_one(tmp_path, plugin_env, correction):  # noqa: F811
    directory = tmp_path / "perturbed"
    directory.mkdir()
    (directory / "rc_test_plugin.py").write_text(PERTURBED_PLUGIN)
    env = {"ASTRAI_PLUGINS": f"{plugin_env['ASTRAI_PLUGINS']},rc_test_plugin",
           "PYTHONPATH": os.pathsep.join([str(directory), plugin_env["PYTHONPATH"]])}
    strategy = {"name": "grpo", "group_size": 4, "rollout_correction": correction}
    for name, nproc in (("one", 1), ("two", 2)):
        config = online_config(tmp_path, name, strategy)
        config["sampler"].update(name="perturbed", every_other_row=True, sign=-1,
                                 stop_token_ids=list(range(8, 24)))
        config["trainer"]["grad_accum_steps"] = 2  # 2 micro-batches of 4 rows per rank
        ok(train(config, tmp_path, name, nproc, env=env))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    cut = CORRECTION + ("truncated_fraction" if correction["mode"] == "truncate"
                        else "masked_fraction")
    assert any(r[cut] > 0 for r in one)  # the weights cut or masked some units
    assert_close_metrics(one, two, (*SAME, cut), rtol=1e-4)
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "two", STEPS))
