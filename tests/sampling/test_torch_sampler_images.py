"""The torch sampler on a vision-language model: prompts with images (one and two, of
different lengths, so left-padded together) prefill with their pixels through the
transformers backend's KV cache, and each completion's log-probs equal the trainer's
full forward over prompt + completion with the same images within 1e-5."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.hf_model import load_transformers_model
from astrai_core.model.head import target_logprobs
from astrai_core.sampling.params import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir

PROMPTS = [(1, "2+2=?"), (2, "12+30=?")]  # (images, text)


def _prompts(processor):
    ids, images = [], []
    for index, (count, text) in enumerate(PROMPTS):
        chat = [{"role": "user", "content": [{"type": "image"}] * count
                 + [{"type": "text", "text": text}]}]
        rendered = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        out = processor(text=[rendered], images=[[tiny_image(3 * index + k) for k in range(count)]],
                        add_special_tokens=False, return_tensors="pt")
        ids.append(out["input_ids"][0].tolist())
        images.append({k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")})
    return ids, images


@pytest.mark.parametrize("family, seed", [("gemma3", 1), ("llava", 1), ("idefics3", 2)])
def test_sampled_logprobs_equal_the_trainers_with_images(tmp_path, family, seed):
    from transformers import AutoProcessor

    directory = write_vlm_dir(tmp_path / family, family)
    processor = AutoProcessor.from_pretrained(str(directory))
    model = load_transformers_model(directory)
    prompts, images = _prompts(processor)
    completions = TorchSampler(model, processor.tokenizer).generate(
        prompts, SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=seed),
        images=images)
    assert len(completions) == 4
    image_token = model.hf.config.image_token_id
    for completion in completions:
        # a random model may sample an image token, which no image fills (not so here)
        assert image_token not in completion.token_ids
        prompt = prompts[completion.prompt_index]
        ids = torch.tensor([prompt + completion.token_ids])
        inputs = dict(images[completion.prompt_index])
        if "token_type_ids" in inputs:  # Gemma 3's: the completion is text
            inputs["token_type_ids"] = torch.nn.functional.pad(
                inputs["token_type_ids"], (0, len(completion.token_ids)))
        with torch.no_grad():
            expected = target_logprobs(model, ids, ids[:, len(prompt):], images=inputs)["logprobs"][0]
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0,
                                   atol=1e-5)
    # the pixels matter: without them the first tokens' log-probs differ
    blind = TorchSampler(model, processor.tokenizer).generate(
        prompts, SamplingParams(n=2, max_new_tokens=1, temperature=1.0, seed=seed))
    assert any(abs(a.logprobs[0] - b.logprobs[0]) > 1e-4 for a, b in zip(completions, blind)
               if a.token_ids[0] == b.token_ids[0]) or any(
        a.token_ids[0] != b.token_ids[0] for a, b in zip(completions, blind))
