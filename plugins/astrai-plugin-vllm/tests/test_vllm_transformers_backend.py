"""The vllm sampler with a transformers-backend policy (a Qwen3-shaped model run by
transformers, not imported): the engine starts from the policy's own Hugging Face
directory, a push carries the family's names as they are, and afterwards the engine's
log-probs equal the trainer's, also when only the embedding changed and the head is tied
to it; a GRPO run on that backend keeps the sampler and the trainer in agreement."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from astrai_core.api import RunConfig, SamplingParams  # noqa: E402
from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts  # noqa: E402
from astrai_core.testing.hf_models import write_hf_model_dir  # noqa: E402

TOLERANCE = 1e-5  # as the other push tests
PROMPTS = [[5, 9, 12, 40, 3], [7, 3, 22]]
SAMPLED = SamplingParams(max_new_tokens=8, temperature=0.8, seed=7, n=2)
# vLLM's CPU attention needs head_dim >= 32
ENGINE_SHAPE = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    max_position_embeddings=256)


def _qwen3_dir(directory, tie: bool):
    return write_hf_model_dir(directory, "qwen3", tie_word_embeddings=tie, **ENGINE_SHAPE)


# multiprocess: the engine core in its own process, the weights as one safetensors payload
@pytest.mark.parametrize(("tie", "multiprocess"), [(False, False), (True, False), (True, True)])
def test_a_push_reaches_the_engine_under_the_familys_names(tie, multiprocess, tmp_path, helpers):
    import torch

    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_plugin_vllm.logprobs import trainer_logprobs
    from astrai_plugin_vllm.sampler import VllmSampler

    policy = load_transformers_model(_qwen3_dir(tmp_path / "hf", tie))
    assert policy.config.tie_word_embeddings == tie
    sampler = VllmSampler(policy, multiprocess=multiprocess, **helpers.engine_options)
    try:
        assert sampler._importer is None  # no conversion: the names are the family's
        before = sampler.generate(PROMPTS, SAMPLED)
        trainer = trainer_logprobs(policy, [PROMPTS[c.prompt_index] for c in before],
                                   [c.token_ids for c in before], 0.8)
        assert helpers.max_abs_diff([c.logprobs for c in before], trainer) <= TOLERANCE
        with torch.no_grad():  # a new embedding, larger; every other weight as it was
            embed = policy.hf.get_input_embeddings().weight
            generator = torch.Generator().manual_seed(1)
            embed.copy_(0.5 * torch.randn(embed.shape, generator=generator))
        sampler.update_weights(None)  # the trainer's way: the live policy changed in place
        after = sampler.generate(PROMPTS, SAMPLED)
        trainer = trainer_logprobs(policy, [PROMPTS[c.prompt_index] for c in after],
                                   [c.token_ids for c in after], 0.8)
        assert helpers.max_abs_diff([c.logprobs for c in after], trainer) <= TOLERANCE
        # the push mattered: the old tokens' log-probs moved far beyond the tolerance
        moved = trainer_logprobs(policy, [PROMPTS[c.prompt_index] for c in before],
                                 [c.token_ids for c in before], 0.8)
        assert helpers.max_abs_diff([c.logprobs for c in before], moved) > 0.05
    finally:
        sampler.close()


def test_grpo_on_the_transformers_backend_runs_with_the_push_check(tmp_path, helpers):
    from astrai_core.training.run import train

    hf = _qwen3_dir(tmp_path / "hf", tie=False)
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    sampler = {"name": "vllm", "max_new_tokens": 4, **helpers.engine_options}
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 4},
                             sampler=sampler, max_steps=2, data={"batch_size": 4})
    config["model"] = {"path": str(hf), "backend": "transformers"}
    # a push that did not reach the engine stops the run (vllm on CPU in float32: 1e-3)
    config["rollout"] = {"max_logprob_diff": 1e-3}
    train(RunConfig.model_validate(config))
    steps = [row for row in read_metrics(tmp_path / "run") if "rollout/logprob_diff_max" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["rollout/logprob_diff_max"] <= 1e-4 for row in steps), steps
    assert [row["rollout/policy_version"] for row in steps] == [0, 1]
    assert steps[0]["grad_norm"] > 0  # the policy moved: the second rollout needed the push
