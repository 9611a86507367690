"""Sampling: log-probs equal a forward pass's, saved sampler weights load in peft on the
Hugging Face base, and the sampling options reach the sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai_core.tinker.engine_types import (AdamSpec, DatumIn, LoraSpec, SamplerTarget,
                                             SampleSpec)
from tests.tinker.conftest import BASE, sft_datums

PROMPT = [1, 7, 9, 4]


@pytest.fixture
def trained(make_engine):
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=4))
    datums, _, _ = sft_datums()
    for _ in range(3):
        engine.forward_backward("m", datums, "cross_entropy")
        engine.optim_step("m", AdamSpec(learning_rate=2e-2))
    return engine, engine.save_weights("m", "sampler", for_sampler=True)


def _forward_logprobs(engine, tokens: list[int]) -> np.ndarray:
    """log p(tokens[t + 1] | tokens[:t + 1]) from a forward pass of the tenant."""
    datum = DatumIn(tokens[:-1], {"target_tokens": np.asarray(tokens[1:], dtype=np.int64),
                                  "weights": np.ones(len(tokens) - 1, dtype=np.float32)})
    return engine.forward("m", [datum], "cross_entropy").outputs[0]["logprobs"]


def test_sampled_and_prompt_logprobs_equal_a_forward_pass(trained):
    engine, key = trained
    out = engine.sample(SamplerTarget(BASE, key), PROMPT, 3, SampleSpec(max_tokens=8, seed=11),
                        prompt_logprobs=True)
    assert len(out.sequences) == 3
    assert len({tuple(s.tokens) for s in out.sequences}) > 1  # n distinct samples
    for sequence in out.sequences:
        assert len(sequence.tokens) == len(sequence.logprobs) == 8
        assert sequence.stop_reason == "length"
        forward = _forward_logprobs(engine, PROMPT + sequence.tokens)
        np.testing.assert_allclose(sequence.logprobs, forward[len(PROMPT) - 1:], atol=1e-5)
    assert out.prompt_logprobs[0] is None
    np.testing.assert_allclose(out.prompt_logprobs[1:], forward[:len(PROMPT) - 1], atol=1e-5)


def test_sampled_logprobs_at_a_temperature_are_the_tempered_distributions(trained):
    """At T != 1 a sampled token's log-prob is log_softmax(logits / T), computed here from
    the tenant's full logits, before top-k / top-p (docs/tinker.md#losses)."""
    engine, key = trained
    out = engine.sample(SamplerTarget(BASE, key), PROMPT, 2,
                        SampleSpec(max_tokens=5, seed=2, temperature=0.7, top_k=20))
    tenant = engine.tenants["m"]
    slot = engine.sampler_slots[key][1]
    for sequence in out.sequences:
        tokens = PROMPT + sequence.tokens
        tenant.base.slots.activate(slot)
        try:
            with torch.no_grad():
                logits = tenant.base.model(torch.tensor([tokens[:-1]]))["logits"][0].float()
        finally:
            tenant.base.slots.activate(None)
        tempered = torch.log_softmax(logits / 0.7, -1)
        want = tempered[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
        np.testing.assert_allclose(sequence.logprobs, want[len(PROMPT) - 1:].numpy(), atol=1e-5)


def test_the_base_samples_without_any_adapter(trained):
    engine, key = trained
    spec = SampleSpec(max_tokens=6, seed=3, temperature=0.0)
    base = engine.sample(SamplerTarget(BASE), PROMPT, 1, spec).sequences[0].tokens
    tuned = engine.sample(SamplerTarget(BASE, key), PROMPT, 1, spec).sequences[0].tokens
    fresh = engine.sample(SamplerTarget(BASE), PROMPT, 1, spec).sequences[0].tokens
    assert base == fresh
    assert base != tuned


def test_stop_tokens_and_seeds(trained):
    engine, key = trained
    target = SamplerTarget(BASE, key)
    first = engine.sample(target, PROMPT, 1, SampleSpec(max_tokens=8, seed=5)).sequences[0]
    again = engine.sample(target, PROMPT, 1, SampleSpec(max_tokens=8, seed=5)).sequences[0]
    assert first == again
    stop = first.tokens[2]
    stopped = engine.sample(target, PROMPT, 1, SampleSpec(max_tokens=8, seed=5,
                                                          stop_tokens=(stop,))).sequences[0]
    assert stopped.stop_reason == "stop"
    assert stopped.tokens == first.tokens[:first.tokens.index(stop) + 1]
    top1 = engine.sample(target, PROMPT, 2, SampleSpec(max_tokens=5, seed=1, top_k=1))
    greedy = engine.sample(target, PROMPT, 1, SampleSpec(max_tokens=5, temperature=0.0))
    assert [s.tokens for s in top1.sequences] == [greedy.sequences[0].tokens] * 2


def test_sampler_weights_load_in_peft_on_the_hugging_face_base(trained, hf_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine, key = trained
    peft_dir = tmp_path / "state" / key / "adapter"
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(peft_dir)).eval()
    tokens = PROMPT + [11, 12, 13, 14]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float()
    hf = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    ours = _forward_logprobs(engine, tokens)
    np.testing.assert_allclose(hf.numpy(), ours, atol=1e-4)
    with torch.no_grad():  # the adapter matters: the bare base gives other numbers
        with model.disable_adapter():
            bare = model(torch.tensor([tokens])).logits[0, :-1].float()
    assert not torch.allclose(torch.log_softmax(bare, -1), torch.log_softmax(logits, -1), atol=1e-3)


def test_stop_strings_end_a_completion(trained, hf_dir):
    from astrai_core.data.tokenizer import load_tokenizer

    engine, key = trained
    target = SamplerTarget(BASE, key)
    free = engine.sample(target, PROMPT, 1, SampleSpec(max_tokens=16, seed=5)).sequences[0]
    tokenizer = load_tokenizer(hf_dir)
    texts = [tokenizer.decode([t], skip_special_tokens=True).strip() for t in free.tokens]
    at = next(i for i, text in enumerate(texts) if i > 0 and text)
    stopped = engine.sample(target, PROMPT, 1, SampleSpec(max_tokens=16, seed=5,
                                                          stop_strings=(texts[at],))).sequences[0]
    assert stopped.stop_reason == "stop"
    assert len(stopped.tokens) <= at + 1 < len(free.tokens)
    assert stopped.tokens == free.tokens[:len(stopped.tokens)]


def test_saved_adapters_for_sampling_are_evicted_least_recent_first(make_engine):
    engine = make_engine(max_sampler_adapters=2, max_adapters=1)
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=4))
    datums, _, _ = sft_datums()
    spec = SampleSpec(max_tokens=4, temperature=0.0)
    keys, first = [], {}
    for step in range(4):  # more saves than slots, each sampled: the RL loop's pattern
        engine.forward_backward("m", datums, "cross_entropy")
        engine.optim_step("m", AdamSpec(learning_rate=2e-2))
        keys.append(engine.save_weights("m", f"s{step}", for_sampler=True))
        first[keys[-1]] = engine.sample(SamplerTarget(BASE, keys[-1]), PROMPT, 1, spec)
    assert list(engine.sampler_slots) == keys[-2:]
    slots = len(engine.bases[BASE].slots.configs)
    assert slots == 3  # the tenant and two sampler adapters
    again = engine.sample(SamplerTarget(BASE, keys[0]), PROMPT, 1, spec)  # reloaded from disk
    assert again == first[keys[0]]


def test_weights_saved_again_under_their_name_are_sampled_new(trained):
    """A sampler adapter loaded for sampling is reloaded once its files are saved anew."""
    engine, key = trained
    spec = SampleSpec(max_tokens=8, seed=11)
    engine.sample(SamplerTarget(BASE, key), PROMPT, 1, spec)  # loads the first save
    datums, _, _ = sft_datums()
    for _ in range(3):
        engine.forward_backward("m", datums, "cross_entropy")
        engine.optim_step("m", AdamSpec(learning_rate=2e-2))
    assert engine.save_weights("m", "sampler", for_sampler=True) == key
    sequence = engine.sample(SamplerTarget(BASE, key), PROMPT, 1, spec).sequences[0]
    forward = _forward_logprobs(engine, PROMPT + sequence.tokens)
    np.testing.assert_allclose(sequence.logprobs, forward[len(PROMPT) - 1:], atol=1e-5)
