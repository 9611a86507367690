"""The native model computes what transformers computes (weights copied by an independent, test-only map)."""

from __future__ import annotations

import pytest
import torch

KINDS = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe"]
ROPES = [
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8},
]


def _batch(seq: int = 12):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (3, seq), generator=generator)
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[2, -3:] = 0  # right padding
    return ids, mask


def _compare(hf, native, ids, mask, **hf_kwargs):
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, **hf_kwargs).logits
        got = native(ids, attention_mask=mask)["logits"]
    real = mask.bool()
    return (expected[real] - got[real]).abs().max().item()


@pytest.mark.parametrize("kind", KINDS)
def test_padded_logits_match_transformers(kind, hf_model, native_from_hf):
    hf = hf_model(kind)
    native = native_from_hf(hf, kind)
    ids, mask = _batch()
    assert _compare(hf, native, ids, mask) <= 1e-5


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_packed_logits_match_transformers(kind, hf_model, native_from_hf):
    hf = hf_model(kind)
    native = native_from_hf(hf, kind)
    ids, _ = _batch()
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]] * 3)
    with torch.no_grad():
        # transformers only detects packed documents without a cache
        expected = hf(input_ids=ids, position_ids=positions, use_cache=False).logits
        got = native(ids, position_ids=positions)["logits"]
    assert (expected - got).abs().max().item() <= 1e-5


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"])
def test_rope_scaling_logits_match_transformers(rope, hf_model, native_from_hf):
    # max_position_embeddings=8 < sequence length 12: dynamic NTK rescales, yarn/llama3 extrapolate
    hf = hf_model("llama", rope_parameters=dict(rope), max_position_embeddings=8)
    native = native_from_hf(hf, "llama")
    ids, mask = _batch()
    assert _compare(hf, native, ids, mask, use_cache=False) <= 1e-5


def test_sliding_window_matches_transformers(hf_model, native_from_hf):
    hf = hf_model("mistral", sliding_window=4)
    native = native_from_hf(hf, "mistral")
    assert native.config.sliding_window == 4
    ids, mask = _batch()
    assert _compare(hf, native, ids, mask) <= 1e-5


def test_tied_embeddings_match_transformers(hf_model, native_from_hf):
    hf = hf_model("qwen3", tie_word_embeddings=True)
    native = native_from_hf(hf, "qwen3")
    assert native.lm_head is None
    ids, mask = _batch()
    assert _compare(hf, native, ids, mask) <= 1e-5


def test_moe_aux_loss_matches_transformers_for_one_moe_layer(hf_model, native_from_hf):
    # decoder_sparse_step=2 with 2 layers: only layer 1 is sparse, so HF's cross-layer pooling
    # and astrai's per-layer mean coincide.
    hf = hf_model("qwen3_moe", decoder_sparse_step=2, output_router_logits=True)
    native = native_from_hf(hf, "qwen3_moe")
    assert [layer.is_moe for layer in native.layers] == [False, True]
    ids, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, output_router_logits=True).aux_loss
        got = native(ids, attention_mask=mask)["aux_loss"]
    assert torch.allclose(got, expected.float(), atol=1e-6)


@pytest.mark.parametrize("kind", ["qwen3", "qwen2_moe"])
def test_gradients_match_transformers(kind, hf_model, native_from_hf):
    hf = hf_model(kind)
    native = native_from_hf(hf, kind)
    ids, mask = _batch()
    # padded positions' outputs are arbitrary (each framework handles masked rows its own way)
    target = torch.randn(3, 12, 128, generator=torch.Generator().manual_seed(2)) * mask[..., None]
    (hf(input_ids=ids, attention_mask=mask).logits * target).sum().backward()
    (native(ids, attention_mask=mask)["logits"] * target).sum().backward()
    hf_grads = dict(hf.named_parameters())
    checked = 0
    for name, param in native.named_parameters():
        hf_name = "model." + name.replace(".attn.", ".self_attn.").replace("attn_norm", "input_layernorm")
        hf_name = hf_name.replace("mlp_norm", "post_attention_layernorm")
        hf_name = hf_name.replace("model.embed.", "model.embed_tokens.")
        hf_name = hf_name.replace(".mlp.router.", ".mlp.gate.").replace("model.lm_head", "lm_head")
        if name.endswith(("experts.gate_proj", "experts.up_proj")):
            gate, up = hf_grads[hf_name.rsplit(".", 1)[0] + ".gate_up_proj"].grad.chunk(2, dim=1)
            expected = gate if name.endswith("gate_proj") else up
        else:
            expected = hf_grads[hf_name].grad
        assert torch.allclose(param.grad, expected, atol=1e-5, rtol=1e-4), name
        checked += 1
    assert checked == len(list(native.parameters()))
