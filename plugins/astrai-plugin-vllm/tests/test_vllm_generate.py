"""The vllm sampler honours the sampler contract: greedy tokens, log-probs, stops, n, seeds."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from astrai_core.sampling import SamplingParams  # noqa: E402

PROMPTS = [[5, 9, 12, 40, 3], [7, 3], list(range(1, 40))]
TOLERANCE = 1e-5  # float32: the contract's agreement with a transformers forward


@pytest.fixture(scope="module", params=["dense", "moe"])
def setup(request, tiny_models, helpers):
    """(sampler on M0, the native M0 model, the transformers M0 model) for dense and MoE."""
    from astrai_plugin_vllm.sampler import VllmSampler

    model = tiny_models[(request.param, 0)]
    native = model.native()
    sampler = VllmSampler(native, **helpers.engine_options)
    yield sampler, native, model.hf
    sampler.close()


def transformers_logprobs(hf, helpers, completions, temperature):
    """The contract's log-probs from a plain transformers forward of the same weights:
    log_softmax(logits / T) of each completion token (independent of the sampler, which
    computes filtered requests' log-probs with astrai's trainer forward)."""
    return [helpers.hf_logprobs(hf, PROMPTS[c.prompt_index], c.token_ids, temperature)
            for c in completions]


def test_greedy_equals_transformers_and_torch_sampler(setup, helpers):
    from astrai_core.sampling.torch_sampler import TorchSampler

    sampler, native, hf = setup
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    ours = sampler.generate(PROMPTS, params)
    torch_out = TorchSampler(native).generate(PROMPTS, params)
    for prompt, mine, theirs in zip(PROMPTS, ours, torch_out, strict=True):
        assert mine.token_ids == helpers.hf_greedy(hf, prompt, 10)
        assert mine.token_ids == theirs.token_ids
        assert mine.finish_reason == "length"
    # greedy log-probs are those of temperature 1
    assert helpers.max_abs_diff([c.logprobs for c in ours], transformers_logprobs(hf, helpers, ours, 1.0)) <= TOLERANCE


@pytest.mark.parametrize("filters", [{}, {"top_k": 5}, {"top_p": 0.8}, {"top_k": 8, "top_p": 0.9, "min_p": 0.05}],
                         ids=["none", "top_k", "top_p", "all"])
def test_logprobs_equal_transformers(setup, helpers, filters):
    sampler, _, hf = setup
    temperature = 0.7
    params = SamplingParams(max_new_tokens=12, temperature=temperature, seed=11, n=3, **filters)
    completions = sampler.generate(PROMPTS, params)
    assert len(completions) == 9 and [c.prompt_index for c in completions] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    ours = [c.logprobs for c in completions]
    assert helpers.max_abs_diff(ours, transformers_logprobs(hf, helpers, completions, temperature)) <= TOLERANCE
    if "top_k" in filters:  # the filter was applied: every sampled token is in the top k
        import torch

        for completion in completions:
            prompt = PROMPTS[completion.prompt_index]
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1:-1]
            ranks = (logits > logits.gather(-1, torch.tensor(completion.token_ids)[:, None])).sum(-1)
            assert int(ranks.max()) < filters["top_k"]


def test_mixed_batch_per_request_params(setup, helpers):
    sampler, _, hf = setup
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.3, top_k=6, seed=3)
    mixed = sampler.generate(PROMPTS, [greedy, sampled, greedy])
    alone = sampler.generate([PROMPTS[0], PROMPTS[2]], greedy)
    assert [mixed[0].token_ids, mixed[2].token_ids] == [c.token_ids for c in alone]
    assert helpers.max_abs_diff([mixed[1].logprobs], transformers_logprobs(hf, helpers, [mixed[1]], 1.3)) <= TOLERANCE


def test_seeded_requests_reproduce_and_copies_differ(setup):
    sampler, _, _ = setup
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, n=2)
    first = sampler.generate(PROMPTS, params)
    again = sampler.generate(PROMPTS, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert first[0].token_ids != first[1].token_ids  # the n copies are different draws


def test_stop_token_ends_completion_and_is_kept(setup):
    sampler, _, _ = setup
    free = sampler.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0))[0]
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    out = sampler.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0,
                                                         stop_token_ids=[stop]))[0]
    assert out.token_ids == free.token_ids[:first + 1]
    assert out.finish_reason == "stop"
    assert out.logprobs == pytest.approx(free.logprobs[:first + 1], abs=1e-6)


class _DigitTokenizer:
    """Token t decodes to chr(ord('a') + t % 26): enough to test stop strings."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + t % 26) for t in ids)


def test_stop_string_cuts_tokens_and_text(setup):
    sampler, _, _ = setup
    tokenizer = _DigitTokenizer()
    free = sampler.generate([PROMPTS[2]], SamplingParams(max_new_tokens=10, temperature=0.0))[0]
    text = tokenizer.decode(free.token_ids)
    stop = text[4:6]
    sampler.tokenizer = tokenizer
    try:
        out = sampler.generate([PROMPTS[2]], SamplingParams(max_new_tokens=10, temperature=0.0,
                                                             stop=(stop,)))[0]
    finally:
        sampler.tokenizer = None
    at = text.find(stop)
    assert out.token_ids == free.token_ids[:at + len(stop)]
    assert out.text == text[:at] and out.finish_reason == "stop"


def test_unexpected_finish_reason_is_an_error(setup, monkeypatch):
    """A request vLLM ends for another reason than stop/length (e.g. aborted) is refused,
    never passed on as a completion."""
    sampler, _, _ = setup
    generate = sampler.engine.generate

    def aborting(*args, **kwargs):
        outputs = generate(*args, **kwargs)
        outputs[0].outputs[0].finish_reason = "abort"
        return outputs

    monkeypatch.setattr(sampler.engine, "generate", aborting)
    with pytest.raises(RuntimeError, match=r"vLLM ended a request with finish_reason='abort'"):
        sampler.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4, temperature=0.0))
