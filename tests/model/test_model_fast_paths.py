"""Generation fast paths: logits_to_keep, the RoPE table, the decode-step mask."""

from __future__ import annotations

import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.masks import build_attention_bias
from astrai_core.model.rope import RotaryEmbedding

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, rope_theta=1000.0)


def test_logits_to_keep_returns_the_last_positions():
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**CONFIG)).eval()
    ids = torch.randint(0, 64, (3, 7))
    with torch.no_grad():
        full = model(ids)["logits"]
        last = model(ids, logits_to_keep=1)["logits"]
        all_kept = model(ids, logits_to_keep=0)["logits"]
    assert last.shape == (3, 1, 64)
    # equal up to float32 rounding: the matmul kernel may depend on the number of rows
    torch.testing.assert_close(last, full[:, -1:], rtol=0, atol=1e-6)
    assert torch.equal(all_kept, full)


def test_rope_table_lookup_equals_direct_computation():
    rotary = RotaryEmbedding(ModelConfig(**CONFIG))
    positions = torch.tensor([[0, 1, 2, 300], [5, 6, 7, 8]])  # 300 grows the table
    cos, sin = rotary.cos_sin(positions, torch.float32)
    direct_cos, direct_sin = rotary._compute(positions, torch.float32)
    torch.testing.assert_close(cos, direct_cos, rtol=0, atol=1e-7)
    torch.testing.assert_close(sin, direct_sin, rtol=0, atol=1e-7)


def test_decode_step_mask_equals_the_general_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    fast = build_attention_bias(query_len=1, past_len=4, attention_mask=mask, position_ids=None,
                                sliding_window=None, dtype=torch.float32, device=torch.device("cpu"))
    # what the general path builds: causal (all earlier keys) and padding
    allowed = mask.bool()[:, None, None, :].clone()
    allowed[..., -1] = True  # a query always sees itself
    expected = torch.zeros(3, 1, 1, 5).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    assert torch.equal(fast.mask, expected)
