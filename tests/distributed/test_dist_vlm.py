"""A vision-language model's SFT on chats with images under FSDP2: 2 processes (each
decoder and vision layer its own unit, the family's ``_no_split_modules``; the vision
tower frozen) equal the 1-process run."""

from __future__ import annotations

import pytest

from astrai_core.testing import read_metrics
from tests.distributed.conftest import assert_close_metrics, assert_close_weights, ok, train, weights
from tests.training.test_vlm_sft import vlm_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


@pytest.mark.parametrize("family", ["gemma3", "idefics3", "qwen2_5_vl"])
def test_two_processes_equal_one(tmp_path, family):
    base = vlm_config(tmp_path, family, steps=STEPS)
    # AdamW's eps above the rounding of a near-zero gradient: with 1e-8, a weight whose
    # gradient is ~1e-9 turns the ranks' other summation order into a visible step
    # (Qwen2.5-VL: one weight of 2048 off by 1.5e-5 after 3 steps, the rest under 1e-6)
    base["trainer"]["eps"] = 1e-6
    ok(train(dict(base, output_dir=str(tmp_path / "one")), tmp_path, "one"))
    ok(train(dict(base, output_dir=str(tmp_path / "two")), tmp_path, "two", 2))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert len(two) == STEPS
    assert_close_metrics(one, two, ("loss", "grad_norm", "tokens"))
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "two", STEPS))
