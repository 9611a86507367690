"""The torch sampler on a vision-language model: prompts with images (one and two, of
different lengths, so left-padded together) prefill with their pixels through the
transformers backend's KV cache, and each completion's log-probs equal the trainer's
full forward over prompt + completion with the same images within 1e-5; greedy
completions are transformers' own ``generate``'s tokens. For the Qwen-VL families this
checks the M-RoPE positions of decoding (each row's text position plus its rope delta,
kept through the KV cache's row selections)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.hf_model import load_transformers_model
from astrai_core.data.processors import load_image_processor
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


@pytest.mark.parametrize("family, seed", [("gemma3", 1), ("llava", 1), ("idefics3", 2),
                                          ("qwen2_5_vl", 2), ("qwen3_vl", 2), ("smolvlm", 1)])
def test_sampled_logprobs_equal_the_trainers_with_images(tmp_path, family, seed):
    directory = write_vlm_dir(tmp_path / family, family)
    processor = load_image_processor(directory)
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
        for name in ("token_type_ids", "mm_token_type_ids"):  # Gemma 3's, Qwen's: text
            if name in inputs:
                inputs[name] = torch.nn.functional.pad(inputs[name],
                                                       (0, len(completion.token_ids)))
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


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "smolvlm", "gemma3"])
def test_greedy_completions_are_transformers_generate_tokens(tmp_path, family):
    from transformers import AutoModelForImageTextToText

    directory = write_vlm_dir(tmp_path / family, family)
    processor = load_image_processor(directory)
    prompts, images = _prompts(processor)
    eos = processor.tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(eos,))
    ours = TorchSampler(load_transformers_model(directory), processor.tokenizer).generate(
        prompts, params, images=images)
    reference = AutoModelForImageTextToText.from_pretrained(str(directory),
                                                            dtype=torch.float32).eval()
    for prompt, inputs, completion in zip(prompts, images, ours, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     **inputs, max_new_tokens=8, do_sample=False,
                                     eos_token_id=eos, pad_token_id=eos)
        assert completion.token_ids == out[0, len(prompt):].tolist()
        assert len(set(completion.token_ids)) > 1  # not one token repeated: positions matter
