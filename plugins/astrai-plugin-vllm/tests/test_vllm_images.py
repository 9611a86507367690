"""The vllm sampler with images: a tiny Idefics3 model (the vision-language family vLLM
0.32 runs on CPU without torchvision) takes each prompt's processor output as the torch
sampler does; its log-probs equal transformers' forward with the same pixels, its greedy
tokens the torch sampler's, and a weight push carries the vision tower and projector."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from astrai_core.api import SamplingParams  # noqa: E402

TOLERANCE = 1e-5  # as the other push tests (float32 on CPU)
# vLLM's CPU attention needs head_dim >= 32 in the language model
ENGINE_SHAPE = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    max_position_embeddings=256)
SAMPLED = SamplingParams(max_new_tokens=6, temperature=0.8, seed=3, n=2)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
VISION = ("model.vision_model.", "model.connector.")


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from astrai_core.api import load_tokenizer
    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_core.testing.hf_vlms import write_vlm_dir

    directory = write_vlm_dir(tmp_path_factory.mktemp("idefics3") / "hf", "idefics3",
                              text=ENGINE_SHAPE)
    return directory, load_tokenizer(directory)


def _policy(vlm):
    from astrai_core.checkpoints.hf_model import load_transformers_model

    return load_transformers_model(vlm[0])


def _prompt(tokenizer, seed: int, text: str = "1+1=?", count: int = 1) -> tuple[list[int], dict]:
    """A chat prompt with ``count`` images, as the trainer renders it: (ids with the
    images' tokens expanded, the processor's image tensors for it)."""
    from astrai_core.testing.hf_vlms import tiny_image

    processor = tokenizer.astrai_processor
    parts = [{"type": "image"}] * count + [{"type": "text", "text": text}]
    rendered = processor.apply_chat_template([{"role": "user", "content": parts}],
                                             add_generation_prompt=True)
    images = [tiny_image(seed + i) for i in range(count)]
    out = processor(text=[rendered], images=[images], return_tensors="pt")
    ids = out.pop("input_ids")[0].tolist()
    out.pop("attention_mask")
    return ids, dict(out)


def _reference(policy, prompts, images, completions, temperature: float) -> list[list[float]]:
    """log_softmax(logits / T) of each completion token by transformers' own forward."""
    values = []
    with torch.no_grad():
        for completion in completions:
            prompt = prompts[completion.prompt_index]
            ids = torch.tensor([prompt + list(completion.token_ids)])
            pixels = images[completion.prompt_index] or {}
            logits = policy.hf(input_ids=ids, **pixels).logits[0].float()
            logprobs = (logits / temperature).log_softmax(-1)
            values.append([logprobs[len(prompt) - 1 + i, token].item()
                           for i, token in enumerate(completion.token_ids)])
    return values


def _sgd_step(policy, prompt, images, completion) -> None:
    """One SGD step on every weight (``freeze: []``): the completion's negative log-likelihood."""
    policy.train()
    ids = torch.tensor([prompt + list(completion)])
    logits = policy.hf(input_ids=ids, **images).logits[0]
    loss = -logits[len(prompt) - 1:-1].log_softmax(-1).gather(
        1, torch.tensor(completion)[:, None]).mean()
    loss.backward()
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter -= 2.0 * parameter.grad
            parameter.grad = None
    policy.eval()


def test_a_push_carries_the_vision_tower_and_greedy_tokens_match_the_torch_sampler(vlm, helpers):
    from astrai_core.sampling.torch_sampler import TorchSampler
    from astrai_plugin_vllm.sampler import VllmSampler

    policy, tokenizer = _policy(vlm), vlm[1]
    prompts, images = map(list, zip(_prompt(tokenizer, 0), _prompt(tokenizer, 1, "2+3=?")))
    sampler = VllmSampler(policy, tokenizer, **helpers.engine_options)
    try:
        names = {name for bucket in sampler._hf_buckets() for name in bucket}
        assert all(any(name.startswith(part) for name in names) for part in VISION)
        before = sampler.generate(prompts, SAMPLED, images=images)
        assert helpers.max_abs_diff([c.logprobs for c in before],
                                    _reference(policy, prompts, images, before, 0.8)) <= TOLERANCE
        vision = {n: p.detach().clone() for n, p in policy.hf.named_parameters()
                  if n.startswith(VISION)}
        _sgd_step(policy, prompts[0], images[0], before[0].token_ids)
        assert all(not torch.equal(p, vision[n]) for n, p in policy.hf.named_parameters()
                   if n in vision and p.ndim == 2)  # the step trained the vision tower too
        sampler.update_weights(None)
        after = sampler.generate(prompts, SAMPLED, images=images)
        assert helpers.max_abs_diff([c.logprobs for c in after],
                                    _reference(policy, prompts, images, after, 0.8)) <= TOLERANCE
        # only the vision tower and projector change now: a push without them shows
        trained = _reference(policy, prompts, images, after, 0.8)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(5)
            for name, parameter in policy.hf.named_parameters():
                if name.startswith(VISION):
                    parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
        moved = _reference(policy, prompts, images, after, 0.8)
        assert helpers.max_abs_diff(trained, moved) > 0.05
        sampler.update_weights(None)
        again = sampler.generate(prompts, SAMPLED, images=images)
        assert helpers.max_abs_diff([c.logprobs for c in again],
                                    _reference(policy, prompts, images, again, 0.8)) <= TOLERANCE
        greedy = sampler.generate(prompts, GREEDY, images=images)
        torch_greedy = TorchSampler(policy).generate(prompts, GREEDY, images=images)
        assert [c.token_ids for c in greedy] == [c.token_ids for c in torch_greedy]
        assert helpers.max_abs_diff([c.logprobs for c in greedy],
                                    [c.logprobs for c in torch_greedy]) <= TOLERANCE
    finally:
        sampler.close()


def test_the_images_reach_the_engine(vlm, helpers):
    from astrai_plugin_vllm.sampler import VllmSampler

    policy, tokenizer = _policy(vlm), vlm[1]
    (ids, first), (same_ids, second) = _prompt(tokenizer, 0), _prompt(tokenizer, 1)
    assert ids == same_ids  # the same text: only the pixels differ
    text = tokenizer("3+4=")["input_ids"]
    two = _prompt(tokenizer, 4, "5+5=?", count=2)  # two images, each its own features
    prompts, images = [ids, ids, text, two[0]], [first, second, None, two[1]]
    sampler = VllmSampler(policy, tokenizer, **helpers.engine_options)
    try:
        out = sampler.generate(prompts, GREEDY, images=images)
        logprobs = [c.logprobs for c in out]
        assert helpers.max_abs_diff(logprobs, _reference(policy, prompts, images, out, 1.0)) \
            <= TOLERANCE
        # the same completion scored under the other image: far from the engine's numbers
        swapped = _reference(policy, prompts, [second, first, None, two[1]], out, 1.0)
        assert helpers.max_abs_diff(logprobs[:2], swapped[:2]) > 0.01
        with pytest.raises(ValueError, match="top_k/top_p/min_p"):
            sampler.generate([ids], SamplingParams(max_new_tokens=2, top_k=5), images=[first])
    finally:
        sampler.close()


def test_a_delta_push_checks_the_vision_tower_by_digest(vlm, helpers):
    from astrai_plugin_vllm.sampler import VllmSampler

    policy, tokenizer = _policy(vlm), vlm[1]
    prompts, images = map(list, zip(_prompt(tokenizer, 2), _prompt(tokenizer, 3, "4+4=?")))
    sampler = VllmSampler(policy, tokenizer, push="delta", **helpers.engine_options)
    try:
        sampler.update_weights(None)  # the first push is whole
        with torch.no_grad():  # then only the vision tower and projector change
            generator = torch.Generator().manual_seed(6)
            for name, parameter in policy.hf.named_parameters():
                if name.startswith(VISION):
                    parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
        sampler.update_weights(None)
        metrics = sampler.metrics()
        assert 0 < metrics["rollout/weight_push_mb"] < metrics["rollout/weight_push_full_mb"]
        sampler.verify_weights()  # every tensor's digest, the vision tower's included
        digests = sampler.engine.collective_rpc(
            "astrai_mirror_digests", args=([n for b in sampler._hf_buckets() for n in b],))[0]
        assert all(any(name.startswith(part) for name in digests) for part in VISION)
        out = sampler.generate(prompts, SAMPLED, images=images)
        assert helpers.max_abs_diff([c.logprobs for c in out],
                                    _reference(policy, prompts, images, out, 0.8)) <= TOLERANCE
    finally:
        sampler.close()


def test_a_family_it_cannot_feed_images_stops_before_the_engine(vlm, tmp_path):
    from astrai_core.api import ConfigError, load_tokenizer
    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_core.testing.hf_vlms import write_vlm_dir
    from astrai_plugin_vllm.sampler import VllmSampler

    gemma = write_vlm_dir(tmp_path / "gemma3", "gemma3")
    with pytest.raises(ConfigError, match="idefics3 models; this policy is 'gemma3'"):
        VllmSampler(load_transformers_model(gemma), load_tokenizer(gemma))
    with pytest.raises(ConfigError, match="needs the vision-language model's processor"):
        VllmSampler(_policy(vlm), tokenizer=None)


def test_each_image_fills_its_own_tokens_and_batch_padding_is_dropped(vlm):
    from astrai_plugin_vllm.images import VisionPolicy

    policy, tokenizer = _policy(vlm), vlm[1]
    vision = VisionPolicy(policy.hf.config, tokenizer.astrai_processor)
    ids, images = _prompt(tokenizer, 0, count=2)
    given = vision.engine_input(ids, images)
    assert given["prompt_token_ids"] == ids
    token = policy.hf.config.image_token_id
    ranges = given["mm_placeholders"]["image"]
    assert [int(r.is_embed.sum()) for r in ranges] == [4, 4]  # 28 px / 7 / scale 2, squared
    assert ranges[0].offset + ranges[0].length < ranges[1].offset
    assert sum(int(r.is_embed.sum()) for r in ranges) == ids.count(token)
    # a batch's all-zero padding patches are no image (as in transformers' forward)
    padded = {name: torch.cat([value, torch.zeros_like(value[:, :1])], 1)
              for name, value in images.items()}
    assert vision.engine_input(ids, padded)["mm_hashes"] == given["mm_hashes"]
    first_only = {name: value[:, :1] for name, value in images.items()}
    with pytest.raises(ValueError, match="hold 2 image patches, its pixel_values 1"):
        vision.engine_input(ids, first_only)
