"""A LoRA policy reaches vLLM as merged weights: after a push the engine generates what a
fresh engine on the merged model generates, with the trainer's (adapter) log-probs.
The adapter directory astrai writes (checkpoints' ``adapter/``) is also what vLLM's own
LoRA support reads: an engine on the base with it computes the adapter model."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")  # the vllm venv installs the core without its dependencies

from astrai_core.sampling import SamplingParams  # noqa: E402

TOLERANCE = 1e-5
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
PROMPTS = [[5, 9, 12, 40, 3], [7, 3, 88]]


def add_trained_adapter(policy):
    """A rank-4 adapter on every projection, changed as by the trainer's step (in place)."""
    import torch

    from astrai_core.config.lora import LoraSection
    from astrai_core.model.lora import adapter_parameters, inject_lora, peft_lora_config

    inject_lora(policy, peft_lora_config(**LoraSection(r=4, alpha=8.0).adapter_settings()))
    with torch.no_grad():
        for param in adapter_parameters(policy).values():
            param.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    return policy


def test_a_lora_policy_is_pushed_merged(tiny_models, helpers, tmp_path):
    from astrai_core.api import save_pretrained
    from astrai_plugin_vllm.logprobs import trainer_logprobs
    from astrai_plugin_vllm.sampler import VllmSampler

    model = tiny_models[("dense", 0)]
    policy = model.native()
    sampler = VllmSampler(policy, **helpers.engine_options)
    try:
        before = sampler.generate(PROMPTS, GREEDY)
        add_trained_adapter(policy)
        sampler.update_weights(None)
        after = sampler.generate(PROMPTS, GREEDY)
        merged_dir = save_pretrained(policy, tmp_path / "merged")  # written merged
    finally:
        sampler.close()
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    from astrai_core.api import load_pretrained

    fresh = VllmSampler(load_pretrained(merged_dir), **helpers.engine_options)
    try:
        expected = fresh.generate(PROMPTS, GREEDY)
    finally:
        fresh.close()
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    trainer = trainer_logprobs(policy, [PROMPTS[c.prompt_index] for c in after],
                               [c.token_ids for c in after], 1.0)
    assert helpers.max_abs_diff([c.logprobs for c in after], trainer) <= TOLERANCE


def test_vllm_native_lora_reads_astrai_adapter_files(tiny_models, helpers, tmp_path):
    """enable_lora + a LoRARequest on save_adapter's directory: the greedy tokens of the
    live peft model (the torch sampler) and the trainer's log-probs."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from astrai_core.checkpoints.lora_files import save_adapter
    from astrai_core.sampling.torch_sampler import TorchSampler
    from astrai_plugin_vllm.logprobs import trainer_logprobs
    from astrai_plugin_vllm.sampler import VllmSampler

    model = tiny_models[("dense", 0)]
    policy = add_trained_adapter(model.native())
    adapter_dir = save_adapter(policy, tmp_path / "adapter", "qwen3")
    # vLLM accepts max_lora_rank 1, 8, 16, 32, ...: the engine is sized for r <= 8
    sampler = VllmSampler(model.native(), **helpers.engine_options,
                          engine_kwargs=dict(enable_lora=True, max_lora_rank=8, max_loras=1))
    try:
        outputs = sampler.engine.generate(
            [TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
            VllmSamplingParams(max_tokens=GREEDY.max_new_tokens, temperature=0.0, ignore_eos=True,
                               logprobs=0, detokenize=False),
            lora_request=LoRARequest("policy", 1, str(adapter_dir)), use_tqdm=False)
    finally:
        sampler.close()
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [[step[t].logprob for step, t in zip(o.outputs[0].logprobs, ids, strict=True)]
                for o, ids in zip(outputs, tokens, strict=True)]
    assert tokens == [c.token_ids for c in TorchSampler(policy).generate(PROMPTS, GREEDY)]
    trainer = trainer_logprobs(policy, PROMPTS, tokens, 1.0)
    assert helpers.max_abs_diff(logprobs, trainer) <= TOLERANCE
