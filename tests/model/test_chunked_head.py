"""The chunked LM head against the full-logits path: log-probs, entropy and their
gradients (w.r.t. the hidden states and the head) agree within 1e-6, for chunk sizes that
do and do not divide the token count, with a temperature; and policy_forward's chunked
path equals the logits path on a real model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from astrai_core.model.head import chunked_logprobs
from astrai_core.rl.functional import entropy_from_logits, token_logprobs

VOCAB, HIDDEN = 97, 16


def inputs(dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 11, HIDDEN, generator=generator, dtype=dtype, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, VOCAB, (3, 11), generator=generator)
    return hidden, weight, targets


def full_path(hidden, weight, targets, temperature):
    """The unchunked reference: full [B, S, V] logits, then log_softmax / entropy."""
    logits = F.linear(hidden, weight)
    return token_logprobs(logits, targets, temperature), entropy_from_logits(logits, temperature)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, 33, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_entropy_and_gradients_equal_the_full_path(chunk_tokens, temperature):
    hidden, weight, targets = inputs()
    # a loss touching both outputs, with different weights per token
    mix = torch.linspace(-1, 1, targets.numel(), dtype=hidden.dtype).reshape(targets.shape)

    def grads(logp, ent):
        loss = (logp * mix).sum() + (ent * mix.flip(0)).sum()
        return torch.autograd.grad(loss, (hidden, weight))

    ref_logp, ref_ent = full_path(hidden, weight, targets, temperature)
    ref_grads = grads(ref_logp, ref_ent)
    logp, ent = chunked_logprobs(hidden, weight, targets, temperature, with_entropy=True,
                                 chunk_tokens=chunk_tokens)
    assert logp.shape == ent.shape == targets.shape
    assert (logp - ref_logp).abs().max().item() < 1e-6
    assert (ent - ref_ent).abs().max().item() < 1e-6
    for got, expected in zip(grads(logp, ent), ref_grads, strict=True):
        assert (got - expected).abs().max().item() < 1e-6


def test_float32_chunked_path_matches_within_float32_rounding_and_without_grad():
    """float32: the row-split matmul may round differently by an ulp (1e-6 relative)."""
    hidden, weight, targets = inputs(torch.float32, seed=3)
    with torch.no_grad():
        ref_logp, ref_ent = full_path(hidden, weight, targets, 1.0)
        logp, ent = chunked_logprobs(hidden, weight, targets, with_entropy=True, chunk_tokens=5)
    assert logp.dtype == torch.float32 and not logp.requires_grad
    torch.testing.assert_close(logp, ref_logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-6, atol=1e-6)


def test_only_one_chunk_of_logits_is_kept_for_backward():
    """Saved tensors of the autograd graph: the chunked path keeps no [tokens, V] logits,
    the full path does."""
    hidden, weight, targets = inputs(torch.float32)
    saved: list[torch.Size] = []

    def pack(tensor):
        saved.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_logprobs(hidden, weight, targets, chunk_tokens=4)
    def biggest_logits():  # saved tensors over the vocabulary: logits or their softmax
        return max((s.numel() for s in saved if len(s) and s[-1] == VOCAB), default=0)

    chunked = biggest_logits()
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        full_path(hidden, weight, targets, 1.0)
    assert biggest_logits() >= targets.numel() * VOCAB
    assert chunked <= 4 * VOCAB  # at most one chunk's (checkpointing recomputes them)


def test_policy_forward_chunked_equals_the_logits_path():
    from astrai_core.model import CausalLM, ModelConfig
    from astrai_core.rollout.batch import RolloutBatch
    from astrai_core.rollout.forward import policy_forward

    torch.manual_seed(0)
    model = CausalLM(ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                 num_layers=2, num_heads=4, num_kv_heads=2,
                                 max_position_embeddings=64)).eval()
    prompts = torch.randint(0, VOCAB, (2, 4))
    responses = torch.randint(0, VOCAB, (2, 5))
    batch = RolloutBatch(prompt_ids=prompts, prompt_mask=torch.ones_like(prompts, dtype=torch.bool),
                         response_ids=responses,
                         response_mask=torch.ones_like(responses, dtype=torch.bool),
                         old_logprobs=None, rewards=torch.zeros(2), reward_components={},
                         group_ids=torch.arange(2))
    with torch.no_grad():
        out = policy_forward(model, batch, 0.8, return_entropy=True)
        logits = model(batch.input_ids(), attention_mask=batch.attention_mask(),
                       position_ids=batch.position_ids())["logits"][:, 3:8]
    torch.testing.assert_close(out["logprobs"], token_logprobs(logits, responses, 0.8),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["entropy"], entropy_from_logits(logits, 0.8),
                               rtol=1e-6, atol=1e-6)


def tiny_model(tied: bool):
    from astrai_core.model import CausalLM, ModelConfig

    torch.manual_seed(0)
    return CausalLM(ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                num_layers=2, num_heads=4, num_kv_heads=2,
                                max_position_embeddings=64, tie_word_embeddings=tied)).double()


class LogitsOnly(torch.nn.Module):
    """A model seen through its logits alone (no chunked head)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("tied", [False, True])
def test_the_models_forward_with_target_ids_equals_its_logits_with_gradients(tied, monkeypatch):
    """target_logprobs on the native model (the chunked head inside its forward, chunks of
    3 tokens) against the same model's logits (target_logprobs' fallback), gradients of
    every parameter included; tied: the embedding is the head."""
    from astrai_core.model import head
    from astrai_core.model.head import has_chunked_head, target_logprobs

    monkeypatch.setattr(head, "CHUNK_LOGITS", 3 * VOCAB)
    model = tiny_model(tied)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    targets = ids[:, 4:]
    results = []
    for target in (model, LogitsOnly(model)):
        model.zero_grad()
        out = target_logprobs(target, ids, targets, 0.7, with_entropy=True)
        assert ("logits" in out) != has_chunked_head(target)
        (out["logprobs"].sum() + (out["entropy"] * 0.3).sum()).backward()
        results.append((out["logprobs"].detach(), out["entropy"].detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logp, ent, grads), (ref_logp, ref_ent, ref_grads) = results
    assert logp.shape == targets.shape
    assert (logp - ref_logp).abs().max() < 1e-6 and (ent - ref_ent).abs().max() < 1e-6
    assert ("lm_head.weight" in grads) != tied
    for name, grad in grads.items():
        assert (grad - ref_grads[name]).abs().max() < 1e-6, name


def test_target_ids_must_be_a_suffix_shorter_than_the_input():
    model = tiny_model(False)
    ids = torch.randint(0, VOCAB, (1, 5))
    with pytest.raises(ValueError, match="T=5, S=5"):
        model(ids, target_ids=ids)
    out = model(ids, target_ids=ids[:, 5:])  # no targets: empty log-probs
    assert out["logprobs"].shape == (1, 0) and "logits" not in out
