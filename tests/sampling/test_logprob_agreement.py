"""The sampler's log-probs equal the trainer's (policy_forward) for the same tokens, and its
greedy output equals transformers' greedy generate on the same (imported) weights."""

from __future__ import annotations

import torch

from astrai_core.plugins import load_plugins
from astrai_core.rollout import policy_forward
from astrai_core.sampling import SamplingParams

TOLERANCE = 1e-5


def _sampler(model):
    return load_plugins().get("sampler", "torch").load()(model=model)


def _max_diff(model, batch, temperature: float) -> float:
    with torch.no_grad():
        trainer = policy_forward(model, batch, temperature=temperature)["logprobs"]
    return (trainer - batch.old_logprobs).abs()[batch.response_mask].max().item()


def test_sampled_logprobs_equal_trainer_logprobs_with_top_k_and_top_p(imported_model, prompts, make_batch):
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=8, top_p=0.8, seed=3, n=2)
    completions = _sampler(imported_model).generate(prompts, params)
    batch = make_batch([prompts[c.prompt_index] for c in completions], completions)
    assert batch.response_mask.sum() == 12 * len(completions)  # no stop token: full length
    assert _max_diff(imported_model, batch, temperature=0.7) <= TOLERANCE


def test_mixed_greedy_and_sampled_batch_logprobs_equal_trainer(imported_model, prompts, make_batch):
    per_prompt = [
        SamplingParams(max_new_tokens=10, temperature=0.0),
        SamplingParams(max_new_tokens=6, temperature=1.3, top_p=0.6, seed=1),
        SamplingParams(max_new_tokens=9, temperature=0.5, top_k=4, seed=2),
        SamplingParams(max_new_tokens=12, temperature=1.0, min_p=0.2, seed=4),
        SamplingParams(max_new_tokens=3, temperature=0.0),
    ]
    completions = _sampler(imported_model).generate(prompts, per_prompt)
    assert [len(c.token_ids) for c in completions] == [10, 6, 9, 12, 3]
    for row, params in enumerate(per_prompt):
        # Greedy requests report T = 1 log-probs.
        batch = make_batch([prompts[row]], [completions[row]])
        assert _max_diff(imported_model, batch, temperature=params.temperature or 1.0) <= TOLERANCE


def test_sampled_tokens_respect_the_filters(imported_model, prompts, reference_logits):
    """Every token sampled with top-k / top-p / min-p lies inside the filtered set."""
    sampler = _sampler(imported_model)
    cases = [SamplingParams(max_new_tokens=10, temperature=1.5, top_k=3, seed=5, n=3),
             SamplingParams(max_new_tokens=10, temperature=1.5, top_p=0.5, seed=6, n=3),
             SamplingParams(max_new_tokens=10, temperature=1.5, min_p=0.3, seed=7, n=3)]
    for params in cases:
        for completion in sampler.generate(prompts, params):
            logits = reference_logits(imported_model, prompts[completion.prompt_index], completion.token_ids)
            probs = (logits / params.temperature).softmax(-1)
            chosen = probs.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
            if params.top_k:
                assert (probs > chosen[:, None] + 1e-6).sum(-1).max() < params.top_k
            if params.top_p < 1.0:  # the mass of strictly more likely tokens is below p
                before = (probs * (probs > chosen[:, None] + 1e-6)).sum(-1)
                assert before.max() < params.top_p
            if params.min_p:
                assert (chosen >= params.min_p * probs.max(-1).values - 1e-6).all()


def test_greedy_output_matches_transformers_generate(hf_and_imported, prompts):
    hf, native = hf_and_imported
    completions = _sampler(native).generate(prompts, SamplingParams(max_new_tokens=16, temperature=0.0))
    for prompt, completion in zip(prompts, completions, strict=True):
        expected = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert completion.token_ids == expected[0, len(prompt):].tolist()
        assert completion.finish_reason == "length"


@torch.no_grad()
def _transformers_log_softmax(hf, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """[len(tokens), V] log_softmax(logits / T) predicting each token, from a plain
    transformers forward (no astrai code involved): the contract's definition."""
    logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].double()
    return torch.log_softmax(logits / temperature, dim=-1)


def test_filtered_sampling_logprobs_equal_transformers_log_softmax(hf_and_imported, prompts):
    """After top-k / top-p / min-p the reported log-probs are still those of the unfiltered
    temperature-scaled distribution, checked against transformers, not the trainer."""
    hf, native = hf_and_imported
    cases = [SamplingParams(max_new_tokens=6, temperature=0.7, top_k=5, seed=3),
             SamplingParams(max_new_tokens=6, temperature=1.3, top_p=0.6, seed=4),
             SamplingParams(max_new_tokens=6, temperature=0.9, top_k=8, top_p=0.8, min_p=0.05,
                            seed=5)]
    for params in cases:
        for completion in _sampler(native).generate(prompts, params):
            prompt = prompts[completion.prompt_index]
            logp = _transformers_log_softmax(hf, prompt, completion.token_ids, params.temperature)
            expected = logp.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
            got = torch.tensor(completion.logprobs, dtype=torch.float64)
            assert (got - expected).abs().max().item() <= TOLERANCE
            if params.top_k:  # the renormalised top-k log-prob differs: the check can tell
                top_mass = logp.exp().topk(params.top_k, dim=-1).values.sum(-1)
                assert top_mass.min().item() < 1 - 1e-3
