"""Long prompts in the torch sampler: one long prompt among short ones does not widen
every row's KV cache to its length (the cache's allocated positions stay far below
batch x longest), every completion equals its prompt generated alone, token for token,
with log-probs equal to the trainer's; a prefill in chunks equals the one-shot prefill
(native decoder and transformers backend, against transformers' own forward)."""

from __future__ import annotations

import weakref

import pytest
import torch

from astrai_core.model import CausalLM
from astrai_core.rollout import policy_forward
from astrai_core.sampling import SamplingParams, TorchSampler
from astrai_core.sampling.prefill import (PADDING_BOUND, PREFILL_PADDING, SHORT_PROMPT,
                                          chunked_prefill, new_cache, padded_batches,
                                          prefill_runs)
from astrai_core.sampling.running_batch import last_logits_only
from tests.sampling.conftest import VOCAB, batch_of, tiny_native

LONG, SHORT, SHORTS = 3000, 40, 7


@pytest.fixture(scope="module")
def long_model() -> CausalLM:
    """A tiny native model whose context holds the long prompt."""
    return tiny_native(seed=3, context=4096)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    draw = lambda n: torch.randint(1, VOCAB, (n,), generator=generator).tolist()  # noqa: E731
    # the long prompt in the middle: the sampler orders by length itself
    shorts = [draw(SHORT - i) for i in range(SHORTS)]
    return shorts[:3] + [draw(LONG)] + shorts[3:]


def _params() -> list[SamplingParams]:
    # greedy and seeded sampled rows, stop tokens on some
    return [SamplingParams(max_new_tokens=10, temperature=0.0) if i % 2 else
            SamplingParams(max_new_tokens=12, temperature=1.2, top_p=0.9, seed=40 + i,
                           stop_token_ids=(17,))
            for i in range(SHORTS + 1)]


def _with_cache_census(model):
    """(peak, forward): ``forward`` records, after each forward, the KV positions
    (rows x columns of a layer's keys) held by every cache still alive."""
    live: weakref.WeakSet = weakref.WeakSet()
    peak = [0]
    forward = model.forward

    def counting(input_ids, *args, **kwargs):
        out = forward(input_ids, *args, **kwargs)
        cache = kwargs.get("kv_cache")
        if cache is not None:
            live.add(cache)
        held = sum(c.keys[0].shape[0] * c.keys[0].shape[2] for c in live)
        peak[0] = max(peak[0], held)
        return out
    return peak, counting


@pytest.mark.parametrize("max_batch_size", [64, 7], ids=["one batch", "continuous"])
def test_one_long_prompt_does_not_widen_the_short_rows(long_model, max_batch_size):
    """Continuous: the 7 short prompts fill the batch; the long one is admitted when the
    first of them finishes, beside the 6 still running, and runs in a batch of its own."""
    prompts, params = _prompts(), _params()
    peak, counting = _with_cache_census(long_model)
    long_model.forward = counting
    try:
        got = TorchSampler(model=long_model, max_batch_size=max_batch_size).generate(prompts, params)
    finally:
        del long_model.forward
    # left-padded together, the 8 rows would hold 8 x 3,000+ positions per layer; here at
    # most twice the real ones (prompts and generated tokens), plus a growth chunk a row
    real = sum(len(p) + q.max_new_tokens for p, q in zip(prompts, params, strict=True))
    assert peak[0] <= PADDING_BOUND * real + 64 * len(prompts)
    assert peak[0] < len(prompts) * LONG / 3
    for prompt, param, completion in zip(prompts, params, got, strict=True):
        alone = TorchSampler(model=long_model).generate([prompt], param)[0]
        assert completion.token_ids == alone.token_ids
        assert completion.finish_reason == alone.finish_reason
        torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(alone.logprobs),
                                   atol=1e-5, rtol=0)
        with torch.no_grad():
            batch = batch_of([prompt], [completion])
            trainer = policy_forward(long_model, batch, temperature=param.temperature or 1.0)
        diff = (trainer["logprobs"] - batch.old_logprobs).abs()[batch.response_mask].max()
        assert diff.item() <= 1e-5


def test_the_cache_grows_a_chunk_at_a_time(long_model):
    """A batch's cache holds its prompts and then a chunk of columns at a time: the
    longest allowed completion is not allocated up front."""
    prompt = _prompts()[0]
    peak, counting = _with_cache_census(long_model)
    long_model.forward = counting
    try:
        out = TorchSampler(model=long_model).generate(
            [prompt], SamplingParams(max_new_tokens=3000, temperature=0.0, stop_token_ids=(5,)))[0]
    finally:
        del long_model.forward
    assert len(out.token_ids) < 200  # it stopped early
    assert len(prompt) + len(out.token_ids) <= peak[0] <= len(prompt) + len(out.token_ids) + 64


def test_padded_batches_bound_the_padding():
    assert padded_batches([40] * 5 + [3000], 64) == [range(0, 5), range(5, 6)]
    assert padded_batches([3, 200, SHORT_PROMPT], 64) == [range(0, 3)]  # short: together
    assert padded_batches([600, 700, 1000, 1100], 64) == [range(0, 4)]  # 4 x 1100 <= 2 x 3400
    assert padded_batches([600, 700, 1000, 3000], 64) == [range(0, 3), range(3, 4)]
    assert padded_batches([10] * 5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    generator = torch.Generator().manual_seed(0)
    lengths = sorted(torch.randint(1, 5000, (300,), generator=generator).tolist())
    batches = padded_batches(lengths, 16)
    assert [i for rows in batches for i in rows] == list(range(len(lengths)))
    for rows in batches:
        part = lengths[rows.start:rows.stop]
        assert len(part) <= 16
        assert max(part) <= SHORT_PROMPT or len(part) * max(part) <= PADDING_BOUND * sum(part)


# ---------------------------------------------------------------- ragged prefill
def test_ragged_batch_prefills_without_its_padding(long_model):
    """Lengths far apart in one decode batch (as partial rollouts' carried sequences): the
    prefill forwards cover at most PREFILL_PADDING times the prompts' tokens, not every row
    padded to the longest, and every completion equals its prompt generated alone, with
    log-probs equal to the trainer's."""
    generator = torch.Generator().manual_seed(11)
    lengths = [5, 9, 17, 33, 60, 61, 130, 250, 251, 400]
    prompts = [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in lengths]
    params = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=i) for i in range(len(lengths))]
    positions = [0]
    forward = long_model.forward

    def counting(input_ids, *args, **kwargs):
        if input_ids.shape[1] > 1:  # a prefill forward (decode steps feed one token)
            positions[0] += input_ids.numel()
        return forward(input_ids, *args, **kwargs)

    long_model.forward = counting
    try:
        got = TorchSampler(model=long_model).generate(prompts, params)
    finally:
        del long_model.forward
    assert positions[0] <= PREFILL_PADDING * sum(lengths)  # padded: 10 x 400 positions
    for prompt, param, completion in zip(prompts, params, got, strict=True):
        alone = TorchSampler(model=long_model).generate([prompt], param)[0]
        assert completion.token_ids == alone.token_ids
        torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(alone.logprobs),
                                   atol=1e-5, rtol=0)
        with torch.no_grad():
            batch = batch_of([prompt], [completion])
            trainer = policy_forward(long_model, batch, temperature=1.0)
        diff = (trainer["logprobs"] - batch.old_logprobs).abs()[batch.response_mask].max()
        assert diff.item() <= 1e-5


def test_prefill_runs_bound_the_padding():
    lengths = [400, 5, 250, 9, 251, 60, 61, 17]
    runs = prefill_runs(lengths)
    assert sorted(row for run in runs for row in run) == list(range(len(lengths)))
    assert [[lengths[row] for row in run] for run in runs] == [[5], [9], [17], [60, 61],
                                                              [250, 251], [400]]
    assert prefill_runs([7] * 5) == [[0, 1, 2, 3, 4]]
    generator = torch.Generator().manual_seed(2)
    lengths = torch.randint(1, 900, (200,), generator=generator).tolist()
    for run in prefill_runs(lengths):
        part = [lengths[row] for row in run]
        assert len(part) * max(part) <= PREFILL_PADDING * sum(part)


# ---------------------------------------------------------------- chunked prefill
def _padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, 60, (n,), generator=generator)
        mask[row, width - n:] = 1
    return ids, mask


def _prefilled(model, ids, mask, chunk: int) -> tuple[torch.Tensor, object]:
    from astrai_core.model.masks import positions_from_attention_mask

    cache = new_cache(model, ids.shape[0], ids.shape[1], torch.device("cpu"))
    with torch.no_grad():
        logits = chunked_prefill(model, ids, cache, attention_mask=mask,
                                 position_ids=positions_from_attention_mask(mask), chunk=chunk,
                                 extra=last_logits_only(model))
    return logits, cache


@pytest.mark.parametrize("chunk", [1, 7, 32])
def test_chunked_prefill_equals_one_shot_native(hf_and_imported, chunk):
    """The imported native decoder, chunked, against transformers' one-shot forward."""
    hf, native = hf_and_imported
    ids, mask = _padded([90, 61, 13], seed=chunk)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits[:, -1].float()
    one_shot, _ = _prefilled(native, ids, mask, chunk=10_000)
    chunked, cache = _prefilled(native, ids, mask, chunk=chunk)
    assert cache.length == ids.shape[1]
    torch.testing.assert_close(chunked, one_shot, atol=1e-5, rtol=0)
    # two implementations: float32 rounding relative to the logits' size
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_gives_the_same_greedy_tokens(long_model):
    prompts = _prompts()[2:5]  # the long one among two short ones
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    whole = TorchSampler(model=long_model, prefill_chunk=100_000).generate(prompts, params)
    chunked = TorchSampler(model=long_model, prefill_chunk=256).generate(prompts, params)
    for a, b in zip(chunked, whole, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["olmo2", "gemma3_text", "mixtral"])
def test_chunked_prefill_equals_one_shot_transformers(model_type):
    """The transformers backend's cache filled in chunks (gemma3: sliding-window layers,
    window 4, shorter than a chunk), against transformers' one-shot forward; greedy
    generation with chunks equals generation without."""
    from astrai_core.model_backends.transformers_lm import TransformersCausalLM
    from astrai_core.testing.hf_models import tiny_causal_lm

    hf = tiny_causal_lm(model_type)
    model = TransformersCausalLM(hf).eval()
    ids, mask = _padded([45, 30, 9], seed=1)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits[:, -1].float()
    chunked, cache = _prefilled(model, ids, mask, chunk=8)
    assert cache.length == ids.shape[1]
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=0)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    whole = TorchSampler(model=model).generate(prompts, params)
    in_chunks = TorchSampler(model=model, prefill_chunk=8).generate(prompts, params)
    assert [c.token_ids for c in in_chunks] == [c.token_ids for c in whole]
    for a, b in zip(in_chunks, whole, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-5, rtol=0)
