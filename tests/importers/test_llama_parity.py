"""The llama importer (llama, mistral, qwen2) computes what transformers computes."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.hf.llama import LlamaImporter
from astrai_core.checkpoints.native import load_pretrained
from astrai_core.testing.parity import (
    max_packed_diff,
    max_padded_diff,
    padded_batch,
    save_hf_model,
    tiny_hf_model,
)

TOL = 1e-4
VOCAB = 128


def import_tiny(tmp_path, model_type, **overrides):
    hf_model = tiny_hf_model(model_type, **overrides)
    save_hf_model(hf_model, tmp_path / "hf")
    LlamaImporter().import_checkpoint(tmp_path / "hf", tmp_path / "native")
    return hf_model, load_pretrained(tmp_path / "native")


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_padded_batch_matches_transformers(tmp_path, model_type):
    hf_model, native = import_tiny(tmp_path, model_type)
    ids, mask = padded_batch(VOCAB, [12, 9, 4])
    assert max_padded_diff(hf_model, native, ids, mask) <= TOL


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_left_padded_batch_with_positions_matches_transformers(tmp_path, model_type):
    hf_model, native = import_tiny(tmp_path, model_type)
    ids, mask = padded_batch(VOCAB, [12, 9, 4], left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    assert max_padded_diff(hf_model, native, ids, mask, positions) <= TOL


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_packed_documents_match_each_document_alone(tmp_path, model_type):
    hf_model, native = import_tiny(tmp_path, model_type)
    assert max_packed_diff(hf_model, native, VOCAB, [5, 8, 3]) <= TOL


ROPE_VARIANTS = {
    "linear": ({"rope_type": "linear", "factor": 2.0}, [12, 9, 4]),
    # dynamic NTK only changes anything past max_position_embeddings (16 here)
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, [24, 19, 10]),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}, [12, 9, 4]),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
              "beta_fast": 32.0, "beta_slow": 1.0}, [12, 9, 4]),
}


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_scaling_matches_transformers(tmp_path, variant):
    rope, lengths = ROPE_VARIANTS[variant]
    hf_model, native = import_tiny(tmp_path, "llama", max_position_embeddings=16,
                                   rope_parameters={"rope_theta": 500.0, **rope})
    assert native.config.rope_scaling["rope_type"] == variant
    assert native.config.rope_theta == 500.0
    ids, mask = padded_batch(VOCAB, lengths)
    assert max_padded_diff(hf_model, native, ids, mask) <= TOL


def test_imported_model_is_not_trivially_equal(tmp_path):
    """Guard on the parity tests: another model's logits are far off at this tolerance."""
    hf_model, _ = import_tiny(tmp_path, "llama")
    other = tiny_hf_model("llama", seed=1)
    ids, mask = padded_batch(VOCAB, [12, 9, 4])
    with torch.no_grad():
        diff = (hf_model(input_ids=ids).logits - other(input_ids=ids).logits).abs().max().item()
    assert diff > 100 * TOL
