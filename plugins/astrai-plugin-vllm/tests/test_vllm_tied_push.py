"""A push that changes only the embedding reaches the engine, whether the LM head is its own
matrix or the embedding itself (tie_word_embeddings): the engine's log-probs then equal the
trainer's. With a tied head the embedding is also the output projection, so a push that
missed the head would leave the engine computing its logits with the old matrix."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from astrai_core.sampling import SamplingParams  # noqa: E402

TOLERANCE = 1e-5  # as the other push tests
PROMPTS = [[5, 9, 12, 40, 3], [7, 3, 88]]
SAMPLED = SamplingParams(max_new_tokens=8, temperature=0.8, seed=7, n=2)


def _policy(source: str, tie: bool, tmp_path, helpers):
    """A Qwen3 imported from transformers, or a from-scratch native model (exported as the
    plain family the arithmetic example uses)."""
    import torch

    from astrai_core.api import CausalLM, ModelConfig

    if source == "qwen3":
        return helpers.build_tiny_model("dense", 0, tmp_path, tie=tie).native()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=2, num_kv_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=tie)
    model = CausalLM(config)
    model.reset_parameters(std=0.2)  # peaked distributions, as the Qwen3 models' init
    return model


@pytest.mark.parametrize(("source", "tie"), [("qwen3", False), ("qwen3", True),
                                             ("scratch", False), ("scratch", True)])
def test_an_embedding_only_push_reaches_the_engine(source, tie, tmp_path, helpers):
    import torch

    from astrai_plugin_vllm.logprobs import trainer_logprobs
    from astrai_plugin_vllm.sampler import VllmSampler

    policy = _policy(source, tie, tmp_path, helpers).eval()
    assert (policy.lm_head is None) == tie
    sampler = VllmSampler(policy, **helpers.engine_options)
    try:
        before = sampler.generate(PROMPTS, SAMPLED)
        with torch.no_grad():  # a new embedding of the same scale; every other weight as it was
            embed = policy.embed.weight
            generator = torch.Generator().manual_seed(1)
            embed.copy_(embed.std() * torch.randn(embed.shape, generator=generator))
        sampler.update_weights(None)  # the trainer's way: the live policy changed in place
        after = sampler.generate(PROMPTS, SAMPLED)
        prompts = [PROMPTS[c.prompt_index] for c in after]
        trainer = trainer_logprobs(policy, prompts, [c.token_ids for c in after], 0.8)
        assert helpers.max_abs_diff([c.logprobs for c in after], trainer) <= TOLERANCE
        # the push mattered: the old tokens' log-probs moved far beyond the tolerance
        moved = trainer_logprobs(policy, [PROMPTS[c.prompt_index] for c in before],
                                 [c.token_ids for c in before], 0.8)
        assert helpers.max_abs_diff([c.logprobs for c in before], moved) > 0.1
    finally:
        sampler.close()
