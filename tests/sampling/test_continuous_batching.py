"""Continuous batching in the torch sampler (more requests than max_batch_size): each
finished row's slot is refilled by the next waiting request, and every completion and
log-prob equals the one-batch sampler's, sequence by sequence (seeded sampling, so
what shares a batch does not matter), with stop tokens, stop strings, n copies and
per-prompt lengths."""

from __future__ import annotations

import pytest
import torch

from astrai_core.sampling import SamplingParams, TorchSampler


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (11,), generator=generator).tolist()
    return [torch.randint(1, 90, (n,), generator=generator).tolist() for n in lengths]


def _params(stop: tuple[int, ...] = ()) -> list[SamplingParams]:
    # long-tailed lengths per prompt, seeded, two completions each
    lengths = [3, 40, 5, 2, 25, 7, 4, 31, 6, 2, 12]
    return [SamplingParams(max_new_tokens=n, temperature=1.3, top_p=0.95, seed=100 + i, n=2,
                           stop_token_ids=stop) for i, n in enumerate(lengths)]


def _decode_batch_sizes(model):
    """The batch size of every decode forward (one new token per row) of ``model``."""
    sizes: list[int] = []
    forward = model.forward

    def counting(input_ids, *args, **kwargs):
        if input_ids.shape[1] == 1 and kwargs.get("kv_cache") is not None:
            sizes.append(input_ids.shape[0])
        return forward(input_ids, *args, **kwargs)
    return sizes, counting


@pytest.mark.parametrize("stop", [(), (17, 42)], ids=["lengths", "stop tokens"])
def test_continuous_batching_gives_the_one_batch_completions(native_model, stop):
    prompts, params = _prompts(), _params(stop)
    reference = TorchSampler(model=native_model, max_batch_size=1000).generate(prompts, params)
    sizes, counting = _decode_batch_sizes(native_model)
    native_model.forward = counting
    seen: list[tuple[int, int]] = []
    try:
        got = TorchSampler(model=native_model, max_batch_size=4).generate(
            prompts, params, on_token=lambda i, t: seen.append((i, t)))
    finally:
        del native_model.forward
    for index, (a, b) in enumerate(zip(got, reference, strict=True)):
        assert a.token_ids == b.token_ids, index
        assert a.finish_reason == b.finish_reason, index
        assert a.prompt_index == b.prompt_index
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-5, rtol=0)
    assert sorted(seen) == sorted((i, t) for i, c in enumerate(got) for t in c.token_ids)
    assert max(sizes) == 4
    # slots are refilled: fewer decode steps than static batches of 4 (sorted by prompt
    # length, as the sampler orders them) would take
    order = sorted(range(len(prompts) * 2), key=lambda i: len(prompts[i // 2]))
    lengths = [len(reference[i].token_ids) for i in order]
    static = sum(max(lengths[s:s + 4]) - 1 for s in range(0, len(lengths), 4))
    assert len(sizes) < static


def test_continuous_batching_with_stop_strings(char_model_and_tokenizer):
    model, tokenizer = char_model_and_tokenizer
    prompts = [tokenizer.encode(text) for text in ("1+2=", "33+4=", "5=", "10+20+30=", "7")]
    params = SamplingParams(max_new_tokens=20, temperature=1.5, seed=3, n=2, stop=("1", "+"))
    reference = TorchSampler(model=model, tokenizer=tokenizer).generate(prompts, params)
    got = TorchSampler(model=model, tokenizer=tokenizer, max_batch_size=3).generate(prompts, params)
    assert [c.text for c in got] == [c.text for c in reference]
    assert [c.token_ids for c in got] == [c.token_ids for c in reference]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in reference]


@pytest.mark.parametrize("max_batch_size", [1000, 4], ids=["one batch", "continuous"])
def test_an_interrupt_ends_the_call_after_its_decode_step(native_model, max_batch_size):
    """Set after the 30th token, the interrupt ends the call at that decode step: every
    unfinished completion comes back as a prefix of its uninterrupted self (same tokens
    and log-probs), finish_reason "abort"; finished ones are whole."""
    import threading

    prompts, params = _prompts(), _params()
    reference = TorchSampler(model=native_model, max_batch_size=1000).generate(prompts, params)
    interrupt, produced = threading.Event(), []

    def count(index, token):
        produced.append(index)
        if len(produced) == 30:
            interrupt.set()

    got = TorchSampler(model=native_model, max_batch_size=max_batch_size).generate(
        prompts, params, on_token=count, interrupt=interrupt)
    aborted = [c for c in got if c.finish_reason == "abort"]
    assert aborted and len(aborted) < len(got)
    assert sum(len(c.token_ids) for c in got) < sum(len(c.token_ids) for c in reference)
    for a, b in zip(got, reference, strict=True):
        if a.finish_reason == "abort":
            assert len(a.token_ids) < len(b.token_ids)
            assert a.token_ids == b.token_ids[:len(a.token_ids)]
            torch.testing.assert_close(torch.tensor(a.logprobs),
                                       torch.tensor(b.logprobs[:len(a.logprobs)]),
                                       atol=1e-5, rtol=0)
        else:
            assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)
    # the step during which it was set was the last: at most one token per row after it
    assert len(produced) - 30 < max(1, min(max_batch_size, len(got)))
