"""The ray sampler on a vision-language model: each prompt's image inputs travel with it
to the worker that samples it, so the workers give the samples and log-probs the torch
sampler gives in-process, and a GRPO run on prompts with images logs what the local
sampler's run logs."""

from __future__ import annotations

import pytest

from astrai_core.api import RunConfig, SamplingParams
from astrai_core.testing import read_metrics, tiny_run_config
from astrai_core.testing.hf_vlms import tiny_image, write_image_prompts, write_vlm_dir
from astrai_plugin_ray.sampler import RaySampler



def _prompts(processor):
    """Three prompts with the same text, two with their own image and one without."""
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2="}]}]
    text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids, images = [], []
    for seed in (0, 1):
        out = processor(text=[text], images=[[tiny_image(seed)]], add_special_tokens=False,
                        return_tensors="np")
        ids.append(out["input_ids"][0].tolist())
        images.append({k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")})
    plain = [{"role": "user", "content": "2+2="}]
    rendered = processor.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    ids.append(processor.tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return ids, [*images, None]


@pytest.mark.parametrize("family", ["gemma3", "idefics3"])
def test_workers_sample_what_the_torch_sampler_samples(ray_session, tmp_path, family):
    from transformers import AutoProcessor

    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_core.sampling.torch_sampler import TorchSampler

    directory = write_vlm_dir(tmp_path / family, family)
    processor = AutoProcessor.from_pretrained(str(directory))
    model = load_transformers_model(directory)
    prompts, images = _prompts(processor)
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=7, n=2)
    local = TorchSampler(model, processor.tokenizer).generate(prompts, params, images=images)
    sampler = RaySampler(model=model, tokenizer=processor.tokenizer, workers=2,
                         worker_resources={"CPU": 0.5})
    try:
        assert sampler.capabilities.images
        remote = sampler.generate(prompts, params, images=images)
    finally:
        sampler.close()
    assert [c.token_ids for c in remote] == [c.token_ids for c in local]
    assert [c.prompt_index for c in remote] == [c.prompt_index for c in local]
    for mine, theirs in zip(remote, local):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)  # other batches
    # the images reached the workers: the same text under two images samples otherwise
    assert [c.logprobs for c in remote[0:2]] != [c.logprobs for c in remote[2:4]]


def _grpo(tmp_path, hf, prompts, sampler=None):
    from astrai_core.training.run import train

    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             sampler=sampler, max_steps=2, data={"batch_size": 2}, threads=1)
    config["model"] = {"path": str(hf)}
    config["rollout"] = {"max_logprob_diff": 1e-5}
    train(RunConfig.model_validate(config))
    return read_metrics(tmp_path / "run")


def test_grpo_on_image_prompts_with_ray_workers_logs_the_local_run(ray_session, tmp_path,
                                                                 assert_logs_match):
    hf = write_vlm_dir(tmp_path / "hf", "gemma3")
    prompts = write_image_prompts(tmp_path / "data", rows=4)
    local = _grpo(tmp_path / "local", hf, prompts)
    remote = _grpo(tmp_path / "ray", hf, prompts, {"name": "ray", "workers": 2,
                                                   "worker_resources": {"CPU": 0.5}})
    assert [r["step"] for r in remote] == [1, 2]
    assert all(r["rollout/logprob_diff_max"] <= 1e-5 for r in remote)
    assert_logs_match(remote, local)
