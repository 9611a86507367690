"""top_k_top_p_filter gives exactly what top_k_filter then top_p_filter give."""

from __future__ import annotations

import torch

from astrai_core.sampling.filters import top_k_filter, top_k_top_p_filter, top_p_filter


def test_fused_top_k_top_p_equals_the_two_filters_on_random_rows():
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        batch, vocab = 1 + trial % 9, 2 + (trial * 37) % 700
        logits = torch.randn(batch, vocab, generator=generator) * (0.5 + trial % 7)
        top_k = torch.randint(0, min(vocab, 40) + 1, (batch,), generator=generator)
        top_p = torch.rand(batch, generator=generator).clamp(min=0.01)
        top_p[torch.rand(batch, generator=generator) < 0.3] = 1.0
        if trial % 4 == 0:
            top_k[torch.rand(batch, generator=generator) < 0.3] = 0  # some rows fall back
        original = logits.clone()
        expected = top_p_filter(top_k_filter(logits, top_k), top_p)
        assert torch.equal(top_k_top_p_filter(logits, top_k, top_p), expected)
        assert torch.equal(logits, original)


def test_fused_filter_keeps_ties_with_the_kth_value():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 0.0], [3.0, 2.0, 1.0, 1.0, 0.0]])
    filtered = top_k_top_p_filter(logits, torch.tensor([2, 2]), torch.tensor([0.999, 0.999]))
    assert (filtered > float("-inf")).tolist() == [[True] * 4 + [False], [True, True, False, False, False]]
