"""top-k / top-p / min-p on hand-computed cases; none of them writes into its input."""

from __future__ import annotations

import torch

from astrai_core.sampling.filters import (min_p_filter, top_k_filter, top_k_top_p_filter,
                                          top_p_filter)

INF = float("-inf")
# Probabilities 0.5, 0.3, 0.15, 0.05 (as logits: their logs).
PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log()[None]


def kept(filtered: torch.Tensor) -> list[list[bool]]:
    return (filtered > INF).tolist()


def test_top_k_keeps_the_k_largest_and_ties_with_the_kth():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [1.0, 2.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0]])
    filtered = top_k_filter(logits, torch.tensor([2, 1, 0]))
    assert kept(filtered) == [[False, True, True, False], [False, True, True, False], [True] * 4]
    assert torch.equal(filtered[0, 1:3], logits[0, 1:3])  # kept values unchanged


def test_top_p_keeps_the_smallest_set_reaching_p():
    # mass before each token (sorted): 0, 0.5, 0.8, 0.95; a token is dropped when that exceeds p.
    logits = LOGITS.expand(4, 4)
    filtered = top_p_filter(logits, torch.tensor([0.4, 0.7, 0.85, 1.0]))
    assert kept(filtered) == [[True, False, False, False], [True, True, False, False],
                              [True, True, True, False], [True] * 4]


def test_top_p_follows_probability_order_not_position():
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    assert kept(top_p_filter(logits, 0.7)) == [[False, True, False, True]]


def test_min_p_drops_tokens_below_the_scaled_top_probability():
    # thresholds: 0.2 * 0.5 = 0.1 drops 0.05; 0.5 * 0.5 = 0.25 drops 0.15 and 0.05.
    filtered = min_p_filter(LOGITS.expand(3, 4), torch.tensor([0.2, 0.5, 0.0]))
    assert kept(filtered) == [[True, True, True, False], [True, True, False, False], [True] * 4]


def test_filters_compose_in_order_and_never_mutate_their_input():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    original = logits.clone()
    top_k = torch.tensor([0, 5, 10, 0, 3, 50])
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.99])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.5, 0.05])
    # top-k, then top-p, then min-p: the order of the sampler (and of transformers and vLLM)
    filtered = min_p_filter(top_k_top_p_filter(logits, top_k, top_p), min_p)
    for fn, arg in ((top_k_filter, top_k), (top_p_filter, top_p), (min_p_filter, min_p)):
        out = fn(logits, arg)
        assert out.data_ptr() != logits.data_ptr()
    assert torch.equal(logits, original)
    assert torch.equal(filtered[0], logits[0])  # every filter off in row 0
    expected_row1 = top_p_filter(top_k_filter(logits[1:2], 5), 0.9)
    assert torch.equal(filtered[1:2], expected_row1)
    expected = [reference_kept(logits[i], int(top_k[i]), float(top_p[i]), float(min_p[i]))
                for i in range(len(logits))]
    assert kept(filtered) == expected
    assert [sum(row) for row in expected][1:] != [50] * 5  # the filters did remove tokens
    kept_values = filtered[filtered > INF]
    assert torch.equal(kept_values, logits[filtered > INF])  # kept logits are unchanged


def reference_kept(row: torch.Tensor, k: int, p: float, min_p: float) -> list[bool]:
    """The kept set written out token by token: the k most likely (k > 0), then the most
    likely tokens until the mass before the next one exceeds p (on the renormalised
    survivors), then those with at least min_p times the top probability."""
    probs = torch.softmax(row.double(), -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    alive = set(order[:k]) if k > 0 else set(order)
    if p < 1.0:
        total = sum(probs[i] for i in alive)
        mass, survivors = 0.0, set()
        for i in (i for i in order if i in alive):
            if mass / total > p:
                break
            survivors.add(i)
            mass += probs[i]
        alive = survivors
    if min_p > 0.0:
        top = max(probs[i] for i in alive)
        alive = {i for i in alive if probs[i] >= min_p * top}
    return [i in alive for i in range(len(probs))]
