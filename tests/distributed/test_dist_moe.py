"""An MoE model trained on 2 processes equals the 1-process run: the load-balancing loss
takes its token fractions and mean router probabilities from the global micro-batch
(summed over the ranks), so the auxiliary loss, the logged metrics and the weights match
within float tolerance (they were ~1e-3 apart with per-rank fractions)."""

from __future__ import annotations

import pytest

from astrai_core.testing import read_metrics
from tests.distributed.conftest import assert_close_metrics, assert_close_weights, ok, train, weights
from tests.rl.test_router_replay import MOE
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


def test_moe_sft_on_two_processes_equals_one(tmp_path):
    base = tiny_config(tmp_path, max_steps=STEPS, warmup_steps=1, save_every=STEPS,
                       grad_accum_steps=2, progress=False)
    base["model"]["config"].update(MOE)
    base["strategy"]["aux_loss_coef"] = 0.5  # large enough to move the router visibly
    for name, nproc in (("one", 1), ("two", 2)):
        ok(train(dict(base, output_dir=str(tmp_path / name)), tmp_path, name, nproc))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert len(two) == STEPS and all(m["moe/aux_loss"] > 0 for m in two)
    assert_close_metrics(one, two, ("loss", "lm_loss", "moe/aux_loss", "grad_norm"))
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "two", STEPS))
