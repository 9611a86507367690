"""RoPE inverse frequencies and cos/sin scale equal transformers' ROPE_INIT_FUNCTIONS."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from astrai_core.model import ModelConfig
from astrai_core.model.rope import compute_inv_freq

THETA = 500000.0
CASES = {
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 2.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 16, "beta_slow": 2},
    "yarn_mscale": {"factor": 4.0, "original_max_position_embeddings": 256, "mscale": 0.707,
                    "mscale_all_dim": 1.0},
    "yarn_attention_factor": {"factor": 4.0, "original_max_position_embeddings": 256,
                              "attention_factor": 1.25},
}


def _configs(rope_type: str, params: dict):
    hf = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=1024,
                     rope_parameters={"rope_type": rope_type, "rope_theta": THETA, **params})
    native = ModelConfig(vocab_size=8, hidden_size=256, intermediate_size=8, num_layers=1, num_heads=4,
                         num_kv_heads=4, max_position_embeddings=1024, rope_theta=THETA,
                         rope_scaling={"rope_type": rope_type, **params})
    return hf, native


@pytest.mark.parametrize("case", list(CASES))
def test_inv_freq_matches_transformers(case):
    rope_type = case.split("_")[0]
    hf, native = _configs(rope_type, CASES[case])
    expected, expected_scale = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    got, scale = compute_inv_freq(native)
    assert torch.equal(got, expected.float())
    assert scale == pytest.approx(expected_scale, abs=0)


def test_dynamic_inv_freq_beyond_max_positions_matches_transformers():
    hf, native = _configs("dynamic", CASES["dynamic"])
    expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=3000)
    got, _ = compute_inv_freq(native, seq_len=3000)
    assert torch.equal(got, expected)
    assert not torch.equal(got, compute_inv_freq(native)[0])


def test_default_inv_freq_matches_transformers():
    hf = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=THETA)
    native = ModelConfig(vocab_size=8, hidden_size=256, intermediate_size=8, num_layers=1, num_heads=4,
                         num_kv_heads=4, rope_theta=THETA)
    expected, expected_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    got, scale = compute_inv_freq(native)
    assert torch.equal(got, expected) and scale == expected_scale == 1.0


def test_old_type_spelling_and_bad_rope_types_are_validated():
    base = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1)
    config = ModelConfig(**base, rope_scaling={"type": "linear", "factor": 2.0})
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="longrope"):
        ModelConfig(**base, rope_scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        ModelConfig(**base, rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0})
    with pytest.raises(ValueError, match="differs from rope_theta"):
        ModelConfig(**base, rope_scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 5.0})
