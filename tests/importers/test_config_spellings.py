"""Old and new HF config spellings give the same native config."""

from __future__ import annotations

import pytest

from astrai_core.checkpoints.hf.llama import LlamaImporter
from astrai_core.errors import CheckpointError

BASE = {"model_type": "llama", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64}


@pytest.mark.parametrize("old_rope", [
    {"type": "linear", "factor": 2.0},          # transformers < 4.45
    {"rope_type": "linear", "factor": 2.0},     # transformers 4.45 - 4.5x
])
def test_rope_theta_plus_rope_scaling_equals_rope_parameters(old_rope):
    importer = LlamaImporter()
    old = importer.config_from_hf({**BASE, "rope_theta": 5e5, "rope_scaling": old_rope})
    new = importer.config_from_hf({**BASE, "rope_parameters": {
        "rope_theta": 5e5, "rope_type": "linear", "factor": 2.0}})
    assert old == new
    assert new.rope_theta == 5e5 and new.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_default_rope_has_no_scaling_in_either_spelling():
    importer = LlamaImporter()
    old = importer.config_from_hf({**BASE, "rope_theta": 1e6, "rope_scaling": None})
    new = importer.config_from_hf({**BASE, "rope_parameters": {"rope_theta": 1e6,
                                                               "rope_type": "default"}})
    assert old == new and new.rope_scaling is None and new.rope_theta == 1e6


def test_llama3_without_original_length_takes_max_position_embeddings():
    """transformers 5 fills original_max_position_embeddings the same way."""
    cfg = LlamaImporter().config_from_hf({**BASE, "rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})
    assert cfg.rope_scaling["original_max_position_embeddings"] == 64


def test_list_of_eos_ids_keeps_the_first():
    cfg = LlamaImporter().config_from_hf({**BASE, "eos_token_id": [7, 9]})
    assert cfg.eos_token_id == 7


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
])
def test_unsupported_variants_are_refused_with_the_reason(change, message):
    with pytest.raises(CheckpointError, match=message):
        LlamaImporter().config_from_hf({**BASE, **change})


def test_qwen2_partial_sliding_window_is_refused():
    hf = {**BASE, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
          "max_window_layers": 1}
    with pytest.raises(CheckpointError, match="some layers only"):
        LlamaImporter().config_from_hf(hf)


def test_qwen2_has_qkv_bias_and_mistral_a_window():
    importer = LlamaImporter()
    assert importer.config_from_hf({**BASE, "model_type": "qwen2"}).attention_bias
    mistral = importer.config_from_hf({**BASE, "model_type": "mistral", "sliding_window": 32})
    assert mistral.sliding_window == 32 and not mistral.attention_bias


def test_exporting_a_feature_the_family_lacks_is_refused():
    cfg = LlamaImporter().config_from_hf({**BASE, "model_type": "qwen2"})
    with pytest.raises(CheckpointError, match="cannot be exported as 'llama'.*attention_bias"):
        LlamaImporter().config_to_hf(cfg, "llama")
