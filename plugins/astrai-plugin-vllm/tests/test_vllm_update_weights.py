"""Weight pushes into a running engine: the same outputs as a fresh engine, and as the trainer."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from astrai_core.sampling import SamplingParams  # noqa: E402

TOLERANCE = 1e-5
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=12, temperature=0.8, seed=7, n=2)


@pytest.fixture(scope="module", params=["dense", "moe"])
def engines(request, tiny_models, helpers):
    """(sampler started on M0, a fresh engine on M1, {0: native M0, 1: native M1}, kind)."""
    from astrai_plugin_vllm.sampler import VllmSampler

    natives = {seed: tiny_models[(request.param, seed)].native() for seed in (0, 1)}
    sampler = VllmSampler(tiny_models[(request.param, 0)].native(), **helpers.engine_options)
    fresh = VllmSampler(natives[1], **helpers.engine_options)
    yield sampler, fresh, natives, request.param
    sampler.close()
    fresh.close()


def _prompts(sampler) -> list[list[int]]:
    """Short prompts and one longer than a KV block, so prefix-cache hits are possible."""
    block = sampler.engine.llm_engine.vllm_config.cache_config.block_size
    long_prompt = [(7 * i + 3) % 120 + 1 for i in range(block + 9)]
    assert len(long_prompt) + 12 <= 256, f"block size {block} too large for these tiny engines"
    return [[5, 9, 12, 40, 3], [7, 3, 88], long_prompt]


def _outputs(sampler, prompts):
    return [sampler.generate(prompts, GREEDY), sampler.generate(prompts, SAMPLED)]


def _check_same(outputs, reference, native, prompts, helpers):
    """Tokens identical to the reference engine's; log-probs within tolerance of it and the trainer's."""
    from astrai_plugin_vllm.logprobs import trainer_logprobs

    for completions, expected, temperature in zip(outputs, reference, (1.0, 0.8), strict=True):
        assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
        ours = [c.logprobs for c in completions]
        assert helpers.max_abs_diff(ours, [c.logprobs for c in expected]) <= TOLERANCE
        trainer = trainer_logprobs(native, [prompts[c.prompt_index] for c in completions],
                                   [c.token_ids for c in completions], temperature)
        assert helpers.max_abs_diff(ours, trainer) <= TOLERANCE


def test_repeated_pushes_match_fresh_engines_and_trainer(engines, helpers):
    sampler, fresh, natives, _ = engines
    prompts = _prompts(sampler)
    reference = {0: _outputs(sampler, prompts), 1: _outputs(fresh, prompts)}  # before any push
    # The two weight sets really differ, or the test would prove nothing.
    assert [c.token_ids for c in reference[0][0]] != [c.token_ids for c in reference[1][0]]
    for version, target in enumerate([1, 0, 1], start=1):  # M0 -> M1 -> M0 -> M1
        assert sampler.update_weights(natives[target].state_dict()) == version
        assert sampler.policy_version == version
        _check_same(_outputs(sampler, prompts), reference[target], natives[target], prompts, helpers)


def test_update_weights_none_reads_the_live_policy(engines, helpers):
    """The trainer updates its model in place and publishes None: the engine must follow."""
    import torch

    sampler, fresh, natives, _ = engines
    prompts = _prompts(sampler)
    with torch.no_grad():
        for name, tensor in sampler.model.state_dict().items():
            tensor.copy_(natives[1].state_dict()[name])
    sampler.update_weights(None)
    _check_same(_outputs(sampler, prompts), _outputs(fresh, prompts), natives[1], prompts, helpers)


def test_cpu_moe_reload_correction_is_needed_and_works(engines, helpers):
    from astrai_plugin_vllm.weights import cpu_moe_reload_bug_present

    sampler, fresh, natives, kind = engines
    if kind != "moe" or not cpu_moe_reload_bug_present():
        pytest.skip("only MoE models on vLLM 0.31-0.32 on CPU need the correction")
    prompts = _prompts(sampler)
    expected = fresh.generate(prompts, GREEDY)
    sampler.update_weights(natives[0].state_dict())
    sampler.fix_cpu_moe_reload = False
    try:
        sampler.update_weights(natives[1].state_dict())
        broken = sampler.generate(prompts, GREEDY)
    finally:
        sampler.fix_cpu_moe_reload = True
    # Without the correction the experts compute with unpacked weights: wrong outputs.
    assert helpers.max_abs_diff([c.logprobs[:1] for c in broken], [c.logprobs[:1] for c in expected]) > 1e-3
    sampler.update_weights(natives[1].state_dict())
    fixed = sampler.generate(prompts, GREEDY)
    assert [c.token_ids for c in fixed] == [c.token_ids for c in expected]
    assert helpers.max_abs_diff([c.logprobs for c in fixed], [c.logprobs for c in expected]) <= TOLERANCE


def test_multiprocess_engine_takes_weights_as_bytes(tiny_models, helpers):
    """The engine core in its own process: weights cross as safetensors bytes."""
    from astrai_core.sampling.torch_sampler import TorchSampler
    from astrai_plugin_vllm.logprobs import trainer_logprobs
    from astrai_plugin_vllm.sampler import VllmSampler

    natives = {seed: tiny_models[("dense", seed)].native() for seed in (0, 1)}
    prompts = [[5, 9, 12, 40, 3], [7, 3, 88]]
    sampler = VllmSampler(tiny_models[("dense", 0)].native(), multiprocess=True, **helpers.engine_options)
    try:
        for target in (0, 1):
            if target:
                sampler.update_weights(natives[target].state_dict())
            ours = sampler.generate(prompts, GREEDY)
            expected = TorchSampler(natives[target]).generate(prompts, GREEDY)
            assert [c.token_ids for c in ours] == [c.token_ids for c in expected]
            trainer = trainer_logprobs(natives[target], prompts, [c.token_ids for c in ours], 1.0)
            assert helpers.max_abs_diff([c.logprobs for c in ours], trainer) <= TOLERANCE
    finally:
        sampler.close()
