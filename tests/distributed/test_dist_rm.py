"""The rm strategy on 2 processes (FSDP2 over gloo) equals the 1-process run: the backbone
sharded as a policy, the score head trained beside it, evaluation split over the ranks."""

from __future__ import annotations

import pytest

from astrai_core.testing import read_metrics, tiny_run_config
from tests.distributed.conftest import (assert_close_metrics, assert_close_weights, ok, train,
                                        weights)
from tests.distributed.test_dist_preference import _write_rows

pytest.importorskip("astrai_plugin_rm")
pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


def test_reward_model_on_two_processes_equals_one(tmp_path):
    pairs = _write_rows(tmp_path / "pairs.jsonl", unpaired=False)
    runs = {}
    for name, nproc in (("one", 1), ("two", 2)):
        config = tiny_run_config(tmp_path, pairs, {"name": "rm",
                                                   "center_rewards_coefficient": 0.1},
                                 data_format="preference", max_steps=STEPS, save_every=STEPS,
                                 eval_every=STEPS, lr=1e-2)
        config.pop("rewards"), config.pop("sampler")
        config["output_dir"] = str(tmp_path / name)
        config["data"].update(batch_size=8, eval_batch_size=4,
                              eval={"path": str(pairs), "format": "preference"})
        config["parallel"] = {"timeout_seconds": 120}
        ok(train(config, tmp_path, name, nproc))
        runs[name] = tmp_path / name
    one, two = read_metrics(runs["one"]), read_metrics(runs["two"])
    train_one = [r for r in one if "loss" in r]
    train_two = [r for r in two if "loss" in r]
    assert len(train_two) == STEPS
    assert_close_metrics(train_one, train_two, ("loss", "grad_norm", "accuracy"))
    evals = [[r for r in run if "eval/accuracy" in r] for run in (one, two)]
    assert len(evals[0]) == len(evals[1]) >= 1
    assert_close_metrics(evals[0], evals[1], ("eval/loss", "eval/accuracy"))
    for module in ("model", "score"):
        assert_close_weights(weights(runs["one"], STEPS, module),
                             weights(runs["two"], STEPS, module))
