"""An MoE model trained on 2 processes equals the 1-process run: the load-balancing loss
takes its token fractions and mean router probabilities from the global micro-batch
(summed over the ranks), so the auxiliary loss, the logged metrics and the weights match
within float tolerance (they were ~1e-3 apart with per-rank fractions)."""

from __future__ import annotations

import pytest

from tests.distributed.conftest import assert_moe_two_processes_equal_one
from tests.rl.test_router_replay import MOE
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


def test_moe_sft_on_two_processes_equals_one(tmp_path):
    base = tiny_config(tmp_path, max_steps=STEPS, warmup_steps=1, save_every=STEPS,
                       grad_accum_steps=2, progress=False)
    base["model"]["config"].update(MOE)
    assert_moe_two_processes_equal_one(base, tmp_path, STEPS)
