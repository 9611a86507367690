"""A transformers-backend model (no native importer) under FSDP2: 2 processes, each
decoder layer its own unit (the family's ``_no_split_modules``), equal the 1-process run,
with full fine-tuning and with a LoRA adapter."""

from __future__ import annotations

import pytest

from astrai_core.testing import read_metrics
from astrai_core.testing.hf_models import write_hf_model_dir
from tests.distributed.conftest import (adapter, assert_close_metrics, assert_close_weights,
                                        assert_moe_two_processes_equal_one, ok, train, weights)
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


@pytest.mark.parametrize("model_type, lora", [("olmo2", False), ("phi3", True)])
def test_two_processes_equal_one(tmp_path, model_type, lora):
    hf = write_hf_model_dir(tmp_path / "hf", model_type)
    base = tiny_config(tmp_path, max_steps=STEPS, save_every=STEPS, progress=False)
    base["model"] = {"path": str(hf), **({"lora": {"r": 4, "alpha": 8}} if lora else {})}
    base["parallel"] = {"activation_checkpointing": True}
    ok(train(dict(base, output_dir=str(tmp_path / "one")), tmp_path, "one"))
    ok(train(dict(base, output_dir=str(tmp_path / "two")), tmp_path, "two", 2))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert len(two) == STEPS
    assert_close_metrics(one, two, ("loss", "grad_norm", "tokens"))
    saved = adapter if lora else weights
    assert_close_weights(saved(tmp_path / "one", STEPS), saved(tmp_path / "two", STEPS))


def test_mixtral_on_two_processes_equals_one_with_the_global_balancing_loss(tmp_path):
    """The family's load-balancing loss takes the global batch's token fractions (summed
    over the ranks, as the native MoE's), so the aux loss and the weights match."""
    hf = write_hf_model_dir(tmp_path / "hf", "mixtral")
    base = tiny_config(tmp_path, max_steps=STEPS, save_every=STEPS, grad_accum_steps=2,
                       progress=False)
    base["model"] = {"path": str(hf)}
    assert_moe_two_processes_equal_one(base, tmp_path, STEPS)
