"""A LoRA policy reaches vLLM as merged weights: after a push the engine generates what a
fresh engine on the merged model generates, with the trainer's (adapter) log-probs."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")  # the vllm venv installs the core without its dependencies

from astrai_core.sampling import SamplingParams  # noqa: E402

TOLERANCE = 1e-5
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
PROMPTS = [[5, 9, 12, 40, 3], [7, 3, 88]]


def test_a_lora_policy_is_pushed_merged(tiny_models, helpers, tmp_path):
    import torch

    from astrai_core.config.lora import LoraSection
    from astrai_core.model import save_pretrained
    from astrai_core.model.lora import adapter_parameters, inject_lora, peft_lora_config
    from astrai_plugin_vllm.logprobs import trainer_logprobs
    from astrai_plugin_vllm.sampler import VllmSampler

    model = tiny_models[("dense", 0)]
    policy = model.native()
    sampler = VllmSampler(policy, **helpers.engine_options)
    try:
        before = sampler.generate(PROMPTS, GREEDY)
        inject_lora(policy, peft_lora_config(LoraSection(r=4, alpha=8.0)))
        with torch.no_grad():  # the trainer's step, in place: a non-trivial adapter
            for param in adapter_parameters(policy).values():
                param.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
        sampler.update_weights(None)
        after = sampler.generate(PROMPTS, GREEDY)
        merged_dir = save_pretrained(policy, tmp_path / "merged")  # written merged
    finally:
        sampler.close()
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    from astrai_core.model import load_pretrained

    fresh = VllmSampler(load_pretrained(merged_dir), **helpers.engine_options)
    try:
        expected = fresh.generate(PROMPTS, GREEDY)
    finally:
        fresh.close()
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    trainer = trainer_logprobs(policy, [PROMPTS[c.prompt_index] for c in after],
                               [c.token_ids for c in after], 1.0)
    assert helpers.max_abs_diff([c.logprobs for c in after], trainer) <= TOLERANCE
