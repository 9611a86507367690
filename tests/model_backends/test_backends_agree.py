"""The same Qwen3 checkpoint through the native backend (imported) and through the
transformers backend computes the same logits and log-probs."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.hf_model import load_transformers_model
from astrai_core.checkpoints.model_source import describe, model_directory
from astrai_core.checkpoints.native import load_pretrained
from astrai_core.model.head import target_logprobs
from astrai_core.plugins import process_registry
from astrai_core.testing.parity import padded_batch, save_hf_model, tiny_hf_model


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_native_and_transformers_backends_agree(tmp_path, model_type):
    registry = process_registry()
    if model_type not in {t for s in registry.specs("model_importer")
                          for t in getattr(s, "model_types", ())}:
        pytest.skip(f"no importer for {model_type} installed")
    hf_dir = save_hf_model(tiny_hf_model(model_type), tmp_path / "hf")
    source = describe(str(hf_dir), None, registry)
    assert source.backend == "native"
    native = load_pretrained(model_directory(source, registry, tmp_path / "cache"))
    other = load_transformers_model(hf_dir)
    ids, mask = padded_batch(128, [10, 7, 4], seed=2, left=True)
    with torch.no_grad():
        a = native(ids, attention_mask=mask)["logits"]
        b = other(ids, attention_mask=mask)["logits"]
        valid = mask.bool()
        assert (a[valid] - b[valid]).abs().max().item() < 1e-5
        targets = ids[:, -3:]
        la = target_logprobs(native, ids, targets, attention_mask=mask)["logprobs"]
        lb = target_logprobs(other, ids, targets, attention_mask=mask)["logprobs"]
        assert (la - lb).abs().max().item() < 1e-5
