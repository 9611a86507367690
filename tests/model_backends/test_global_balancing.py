"""The transformers backend's load-balancing loss over the global batch: on one process
it equals the family's own ``load_balancing_loss_func``, and the sums of two halves of a
batch give the loss of the whole batch (what the ranks of a distributed run compute)."""

from __future__ import annotations

import sys

import torch

from astrai_core.model_backends.transformers_lm import global_switch_loss
from astrai_core.testing.hf_models import tiny_causal_lm
from astrai_core.testing.parity import padded_batch


def _router_logits(hf, ids, mask):
    with torch.no_grad():
        out = hf.model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    return out.router_logits


def test_one_process_equals_the_familys_own_loss():
    hf = tiny_causal_lm("mixtral").eval()
    ids, mask = padded_batch(64, [9, 6, 3], seed=1)
    logits = _router_logits(hf, ids, mask)
    experts, top_k = hf.config.num_local_experts, hf.config.num_experts_per_tok
    family = sys.modules[type(hf).__module__].load_balancing_loss_func
    for attention_mask in (mask, None):
        expected = family(logits, experts, top_k, attention_mask)
        got = global_switch_loss(logits, experts, top_k, attention_mask, lambda t: t)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_two_halves_summed_give_the_whole_batchs_loss():
    hf = tiny_causal_lm("mixtral").eval()
    ids, mask = padded_batch(64, [9, 6, 3, 7], seed=2)
    experts, top_k = hf.config.num_local_experts, hf.config.num_experts_per_tok
    whole = global_switch_loss(_router_logits(hf, ids, mask), experts, top_k, mask, lambda t: t)
    halves = [(ids[:2], mask[:2]), (ids[2:], mask[2:])]
    logits = [_router_logits(hf, i, m) for i, m in halves]
    # Rank 1's sum over the ranks adds rank 0's terms, as the all-reduce does.
    rank0: list[torch.Tensor] = []
    global_switch_loss(logits[0], experts, top_k, halves[0][1], lambda t: rank0.append(t) or t)
    got = global_switch_loss(logits[1], experts, top_k, halves[1][1], lambda t: t + rank0[0])
    torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-7)
