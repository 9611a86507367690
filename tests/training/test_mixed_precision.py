"""Mixed precision (autocast) runs against the float32 run from the same weights: the same
first-step loss and gradient norm within the half-precision tolerance, and real training."""

from __future__ import annotations

import pytest
import torch

from tests.training.reference import (checkpoint_weights, run, save_start_model,
                                      text_run_config, write_texts)

# bf16 keeps 8 mantissa bits; the loss of a 2-layer model moves by a few steps
TOLERANCE = {"bf16": 2e-2}


@pytest.mark.parametrize("precision", ["bf16"])
def test_autocast_run_matches_float32_within_half_precision(tmp_path, precision):
    start = save_start_model(tmp_path / "start")
    data = write_texts(tmp_path / "docs.jsonl")
    full = run(tmp_path, text_run_config(tmp_path, data, start, out="fp32", max_steps=3),
               "fp32.yaml")
    half = run(tmp_path, text_run_config(tmp_path, data, start, out="half", max_steps=3,
                                         mixed_precision=precision), "half.yaml")
    tolerance = TOLERANCE[precision]
    assert half[0]["loss"] == pytest.approx(full[0]["loss"], rel=tolerance)
    assert half[0]["grad_norm"] == pytest.approx(full[0]["grad_norm"], rel=5 * tolerance)
    assert half[0]["loss"] != full[0]["loss"]  # autocast really ran in half precision
    assert half[-1]["loss"] < half[0]["loss"]  # and it trains
    weights = checkpoint_weights(tmp_path / "half", 3)
    assert {t.dtype for t in weights.values()} == {torch.float32}  # master weights stay fp32
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_fp16_is_not_offered_without_loss_scaling(tmp_path):
    from astrai_core.errors import ConfigError

    start = save_start_model(tmp_path / "start")
    config = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                             mixed_precision="fp16")
    with pytest.raises(ConfigError, match=r"trainer\.mixed_precision: Input should be 'no' or 'bf16'"):
        run(tmp_path, config)
