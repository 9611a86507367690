"""The transformers backend against transformers itself: logits, log-probs through the
chunked head, padding, packed documents, and the torch sampler's KV-cached generation
(its log-probs equal the trainer's, greedy equals ``generate``)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.model.head import target_logprobs
from astrai_core.model_backends.transformers_lm import TransformersCausalLM
from astrai_core.sampling import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing.hf_models import TINY_FAMILIES, tiny_causal_lm
from astrai_core.testing.parity import padded_batch

FAMILIES = sorted(TINY_FAMILIES)


def _pair(model_type: str, **overrides):
    hf = tiny_causal_lm(model_type, **overrides)
    return hf, TransformersCausalLM(hf).eval()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_logits_and_chunked_logprobs_equal_transformers(model_type):
    hf, model = _pair(model_type)
    ids, mask = padded_batch(64, [9, 6, 3], seed=1)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits.float()
        logits = model(ids, attention_mask=mask)["logits"]
        valid = mask.bool()
        assert (logits[valid] - expected[valid]).abs().max().item() < 1e-5
        targets = ids[:, -4:]
        out = target_logprobs(model, ids[:, :], targets, temperature=0.7, with_entropy=True,
                              attention_mask=mask)
        reference = torch.log_softmax(expected[:, -5:-1] / 0.7, dim=-1)
        picked = reference.gather(-1, targets[..., None])[..., 0]
        entropy = -(reference.exp() * reference).sum(-1)
        rows = mask[:, -5:-1].bool() & mask[:, -4:].bool()
        assert (out["logprobs"] - picked)[rows].abs().max().item() < 1e-5
        assert (out["entropy"] - entropy)[rows].abs().max().item() < 1e-5


def test_gemma_soft_capping_goes_through_the_chunked_head():
    hf, model = _pair("gemma3_text", final_logit_softcapping=0.5)
    ids = torch.arange(1, 9)[None]
    with torch.no_grad():
        expected = hf(input_ids=ids).logits.float()
        assert expected.abs().max() < 0.5  # capped
        out = target_logprobs(model, ids, ids[:, 1:])
        reference = torch.log_softmax(expected[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert (out["logprobs"] - reference).abs().max().item() < 1e-5


@pytest.mark.parametrize("model_type", FAMILIES)
def test_packed_documents_are_kept_apart(model_type):
    hf, model = _pair(model_type)
    docs = [torch.randint(1, 64, (1, n), generator=torch.Generator().manual_seed(n))
            for n in (5, 7)]
    packed = torch.cat(docs, dim=1)
    positions = torch.cat([torch.arange(d.shape[1]) for d in docs])[None]
    with torch.no_grad():
        logits = model(packed, position_ids=positions)["logits"][0]
        alone = torch.cat([hf(input_ids=d).logits[0] for d in docs])
    assert (logits - alone).abs().max().item() < 1e-5


@pytest.mark.parametrize("model_type", FAMILIES)
def test_sampler_logprobs_equal_the_trainers(model_type):
    _, model = _pair(model_type)
    prompts = [[3, 9, 12, 7, 1], [4, 2], [8, 8, 8]]
    params = SamplingParams(max_new_tokens=6, temperature=0.9, seed=3)
    outs = TorchSampler(model=model).generate(prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            trainer = target_logprobs(model, ids, torch.tensor([out.token_ids]),
                                      temperature=0.9)["logprobs"][0]
        assert (trainer - torch.tensor(out.logprobs)).abs().max().item() < 1e-5


@pytest.mark.parametrize("model_type", FAMILIES)
def test_greedy_generation_equals_generate(model_type):
    hf, model = _pair(model_type)
    prompt = [3, 9, 12, 7, 1, 4]
    out = TorchSampler(model=model).generate([prompt], SamplingParams(max_new_tokens=8,
                                                                      temperature=0.0))[0]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):]
    assert out.token_ids == expected.tolist()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_fsdp_units_are_the_families_decoder_layers(model_type):
    from astrai_core.distributed.fsdp import decoder_layers

    hf, model = _pair(model_type)
    layers = decoder_layers(model)
    assert len(layers) == hf.config.num_hidden_layers
    assert {type(layer).__name__ for layer in layers} == set(hf._no_split_modules)


def test_activation_checkpointing_keeps_the_gradients():
    ids = torch.arange(1, 13)[None]
    grads = []
    for checkpointing in (False, True):
        _, model = _pair("olmo2")
        model.train()
        if checkpointing:
            model.enable_activation_checkpointing()
            assert model.activation_checkpointing
        target_logprobs(model, ids, ids[:, 1:])["logprobs"].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])
