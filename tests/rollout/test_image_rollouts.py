"""Rollouts on prompts with images: the prompt rows' images reach the sampler, stay with
their samples in the rollout, and every trainer forward over the rollout takes them, so
the trainer's log-probs equal the sampler's; without the images (or with another
prompt's) they do not."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from astrai_core.checkpoints.hf_model import load_transformers_model
from astrai_core.data.tokenize import tokenize_source
from astrai_core.data.tokenizer import load_tokenizer
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout.dynamic_sampling import concat_rollouts
from astrai_core.rollout.forward import policy_forward
from astrai_core.rollout.records import PromptRecord
from astrai_core.rollout.runner import RolloutRunner
from astrai_core.sampling.params import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir


def _vlm(tmp_path, family):
    directory = write_vlm_dir(tmp_path / family, family)
    return load_transformers_model(directory), load_tokenizer(directory)


def _records(tokenizer, tmp_path, count=2):
    """``count`` prompt records with the same text, each with its own image."""
    lines = []
    for i in range(count):
        tiny_image(10 + i).save(tmp_path / f"p{i}.png")
        user = [{"type": "image_url", "image_url": {"url": f"p{i}.png"}},
                {"type": "text", "text": "3+4="}]
        lines.append(json.dumps({"messages": [{"role": "user", "content": user}],
                                 "answer": "7"}))
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    source = tokenize_source(path, "prompt", tokenizer, tmp_path / "cache")
    return [PromptRecord(prompt_ids=[int(t) for t in source.fields["prompt"].tokens_of(i)],
                         prompt_text=source.records[i]["prompt_text"],
                         columns=source.records[i]["columns"], images=source.images.of(i))
            for i in range(count)]


def _runner(model, tokenizer, records):
    rewards = RewardSet.from_config([{"name": "exact_match"}])
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)
    return RolloutRunner(TorchSampler(model, tokenizer), tokenizer, rewards, params,
                         group_size=2, prompt_source=records, prompts_per_rollout=len(records),
                         pad_token_id=tokenizer.pad_token_id or 0)


def _logprobs(model, rollout):
    with torch.no_grad():
        out = policy_forward(model, rollout)["logprobs"]
    return torch.where(rollout.response_mask, out, 0.0)


@pytest.mark.parametrize("family", ["gemma3", "llava", "idefics3"])
def test_trainer_equals_sampler_per_row_and_the_image_matters(tmp_path, family):
    model, tokenizer = _vlm(tmp_path, family)
    records = _records(tokenizer, tmp_path)
    assert records[0].prompt_ids == records[1].prompt_ids  # the same text
    rollout = _runner(model, tokenizer, records).draw()
    assert len(rollout) == 4 and rollout.images  # each sample keeps its prompt's image
    mask = rollout.response_mask
    trainer = _logprobs(model, rollout)
    assert (trainer - rollout.old_logprobs).abs().max().item() <= 1e-5

    # the trainer's forward takes the image: without it, or with the other prompt's,
    # the same tokens score otherwise (the sampler's log-probs above had the image)
    blind = _logprobs(model, replace(rollout, images={}))
    swapped = _logprobs(model, replace(rollout, images=rollout.select([2, 3, 0, 1]).images))
    for other in (blind, swapped):
        assert ((other - trainer).abs() * mask).max().item() > 1e-4

    # the same text with two images: the sampler's first-token distributions differ
    first = rollout.response_ids[:, 0]
    same_token = [(a, b) for a in (0, 1) for b in (2, 3) if first[a] == first[b]]
    for a, b in same_token:
        assert abs(rollout.old_logprobs[a, 0] - rollout.old_logprobs[b, 0]) > 1e-4


def test_a_sampled_image_token_is_never_drawn(tmp_path):
    """A vision-language model never samples its image placeholder: a forward would put
    image features where the sampler saw a text token."""
    model, tokenizer = _vlm(tmp_path, "llava")
    image_token = model.hf.config.image_token_index
    with torch.no_grad():  # make the placeholder the likeliest token by far
        model.hf.lm_head.weight[image_token] = model.hf.lm_head.weight[image_token] * 0 + 1.0
    sampler = TorchSampler(model, tokenizer)
    records = _records(tokenizer, tmp_path, 1)
    for params in (SamplingParams(max_new_tokens=4, temperature=1.0, seed=0, n=4),
                   SamplingParams(max_new_tokens=4, temperature=0.0)):
        completions = sampler.generate([records[0].prompt_ids], params,
                                       images=[records[0].images])
        assert all(image_token not in c.token_ids for c in completions)


def test_dynamic_sampling_keeps_each_rows_images(tmp_path):
    model, tokenizer = _vlm(tmp_path, "gemma3")
    records = _records(tokenizer, tmp_path, 2)
    runner = _runner(model, tokenizer, records)
    short = runner.rollout(records[:1])
    text = replace(runner.rollout(records[1:]), images={})  # a part without images
    joined = concat_rollouts([short, text])
    assert joined.prompt_ids.shape[1] == max(short.prompt_ids.shape[1], text.prompt_ids.shape[1])
    torch.testing.assert_close(_logprobs(model, joined.select([0, 1])),
                               _logprobs(model, short), rtol=0, atol=1e-6)
    assert joined.images["image/pixel_values.rows"].tolist() == [1, 1, 0, 0]
    assert set(joined.tensors()) >= {"images.image/pixel_values", "images.image/token_type_ids"}
