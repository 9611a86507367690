"""Behaviour of the torch sampler: batching independence, seeds, stops, n, weights, the
sampled distribution itself."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from astrai_core.sampling import SamplingParams, TorchSampler

SEEDED = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=11)
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


@pytest.mark.parametrize("params", [SEEDED, GREEDY], ids=["seeded", "greedy"])
def test_completion_does_not_depend_on_the_other_prompts(native_model, prompts, params):
    target = [9, 8, 7, 6]
    alone = TorchSampler(model=native_model).generate([target], params)[0]
    others = [p for p in prompts]
    for batch in ([*others, target], [target, *others[:2]], [others[2], target, others[3]]):
        # Different batch sizes and paddings (longer and shorter neighbours).
        got = TorchSampler(model=native_model).generate(batch, params)[batch.index(target)]
        assert got.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)
    small_batches = TorchSampler(model=native_model, max_batch_size=2).generate([*others, target], params)
    assert small_batches[-1].token_ids == alone.token_ids


def test_seed_reproduces_and_different_seeds_differ(native_model, prompts):
    sampler = TorchSampler(model=native_model)
    params = SamplingParams(max_new_tokens=12, temperature=1.5, seed=0)
    first = [c.token_ids for c in sampler.generate(prompts, params)]
    assert [c.token_ids for c in sampler.generate(prompts, params)] == first
    other = [c.token_ids for c in sampler.generate(prompts, params.model_copy(update={"seed": 1}))]
    assert other != first


def test_unseeded_sampling_follows_torch_manual_seed(native_model, prompts):
    sampler = TorchSampler(model=native_model)
    params = SamplingParams(max_new_tokens=8, temperature=1.5)
    torch.manual_seed(123)
    first = [c.token_ids for c in sampler.generate(prompts, params)]
    torch.manual_seed(123)
    assert [c.token_ids for c in sampler.generate(prompts, params)] == first


def test_n_completions_per_prompt_grouped_in_order(native_model, prompts):
    params = SamplingParams(max_new_tokens=6, temperature=1.5, seed=4, n=3)
    outs = TorchSampler(model=native_model).generate(prompts[:2], params)
    assert [c.prompt_index for c in outs] == [0, 0, 0, 1, 1, 1]
    assert len({tuple(c.token_ids) for c in outs[:3]}) > 1  # the copies differ
    greedy = TorchSampler(model=native_model).generate(prompts[:2], GREEDY.model_copy(update={"n": 2}))
    assert greedy[0].token_ids == greedy[1].token_ids


def test_stop_token_ends_the_completion_and_is_kept(native_model, prompts):
    sampler = TorchSampler(model=native_model)
    full = sampler.generate(prompts, GREEDY)
    stop = full[0].token_ids[3]
    first = full[0].token_ids.index(stop)
    stopped = sampler.generate(prompts, GREEDY.model_copy(update={"stop_token_ids": (stop,)}))
    assert stopped[0].token_ids == full[0].token_ids[:first + 1]
    assert stopped[0].finish_reason == "stop"
    assert stopped[0].logprobs == pytest.approx(full[0].logprobs[:first + 1], abs=1e-5)
    for before, after in zip(full[1:], stopped[1:], strict=True):  # other rows unaffected
        cut = before.token_ids.index(stop) + 1 if stop in before.token_ids else len(before.token_ids)
        assert after.token_ids == before.token_ids[:cut]
        assert after.finish_reason == ("stop" if stop in before.token_ids else "length")


def test_stop_string_cuts_the_text(char_model_and_tokenizer):
    model, tokenizer = char_model_and_tokenizer
    sampler = TorchSampler(model=model, tokenizer=tokenizer)
    prompt = tokenizer("12+35=")["input_ids"]
    full = sampler.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
    assert len(full.text) >= 6
    stop = full.text[3:5]
    at = full.text.index(stop)
    out = sampler.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[:at]
    assert out.token_ids == full.token_ids[:len(out.token_ids)]
    assert stop in tokenizer.decode(out.token_ids)
    assert stop not in tokenizer.decode(out.token_ids[:-1])


def test_stop_strings_without_tokenizer_are_refused(native_model):
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        TorchSampler(model=native_model).generate([[1, 2]], SamplingParams(stop=("x",)))


def test_update_weights_loads_tensors_and_bumps_the_version(native_model, prompts):
    model = type(native_model)(native_model.config)
    model.load_state_dict(native_model.state_dict())
    sampler = TorchSampler(model=model)
    before = sampler.generate(prompts, GREEDY)
    assert sampler.update_weights() == 1
    changed = {k: v + 0.5 * torch.randn_like(v) for k, v in native_model.state_dict().items()}
    assert sampler.update_weights(changed) == 2
    assert torch.equal(model.embed.weight, changed["embed.weight"])
    assert [c.token_ids for c in sampler.generate(prompts, GREEDY)] != [c.token_ids for c in before]
    sampler.update_weights(native_model.state_dict())
    assert [c.token_ids for c in sampler.generate(prompts, GREEDY)] == [c.token_ids for c in before]


def test_training_mode_is_restored_and_callback_sees_every_token(native_model, prompts):
    native_model.train()
    seen: list[tuple[int, int]] = []
    try:
        outs = TorchSampler(model=native_model).generate(
            prompts[:2], SamplingParams(max_new_tokens=5, temperature=1.0, seed=0, n=2),
            on_token=lambda index, token: seen.append((index, token)))
        assert native_model.training
    finally:
        native_model.eval()
    for index, completion in enumerate(outs):
        assert [t for i, t in seen if i == index] == completion.token_ids


class FixedLogits(nn.Module):
    """A 'model' whose next-token logits are always the same: the sampled frequencies
    must follow the filtered, temperature-scaled distribution."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits)
        self.config = SimpleNamespace(num_layers=0, num_kv_heads=1, head_dim=1)

    def forward(self, input_ids, attention_mask=None, position_ids=None, kv_cache=None):
        kv_cache.advance(input_ids.shape[1])
        return {"logits": self.logits.expand(*input_ids.shape, -1)}


@pytest.mark.parametrize("update, expected", [
    ({}, [0.5, 0.3, 0.15, 0.05]),
    ({"top_p": 0.85}, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
    ({"top_k": 2}, [0.625, 0.375, 0.0, 0.0]),
    ({"temperature": 2.0}, [p ** 0.5 / sum(q ** 0.5 for q in (0.5, 0.3, 0.15, 0.05))
                            for p in (0.5, 0.3, 0.15, 0.05)]),
])
def test_sampled_frequencies_follow_the_distribution(update, expected):
    model = FixedLogits(torch.tensor([0.5, 0.3, 0.15, 0.05]).log())
    params = SamplingParams(max_new_tokens=4000, temperature=1.0, seed=0).model_copy(update=update)
    tokens = TorchSampler(model=model).generate([[0]], params)[0].token_ids
    counts = Counter(tokens)
    for token, probability in enumerate(expected):
        assert counts[token] / len(tokens) == pytest.approx(probability, abs=0.025)


def test_completions_sharing_a_prompt_equal_those_prefilled_alone(native_model, prompts):
    """The n completions of a prompt share one prefill; each must equal the completion
    sampled in a batch of one row (its own prefill), token for token."""
    params = SamplingParams(n=4, max_new_tokens=8, temperature=1.0, seed=5)
    shared = TorchSampler(model=native_model).generate(prompts[:3], params)
    alone = TorchSampler(model=native_model, max_batch_size=1).generate(prompts[:3], params)
    assert len(shared) == 12 and len({tuple(c.token_ids) for c in shared}) > 3  # they differ
    for got, want in zip(shared, alone, strict=True):
        assert got.prompt_index == want.prompt_index and got.token_ids == want.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5, rtol=0)
