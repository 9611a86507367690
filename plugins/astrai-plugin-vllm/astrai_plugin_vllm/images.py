"""Prompts with images for a vLLM engine running a vision-language model.

The sampler takes each prompt as the trainer sees it: token ids in which the processor
already expanded every image into its tokens, and the processor's tensors for that prompt
(``pixel_values``, ...), as the torch sampler does. vLLM 0.32 would expand the image
placeholders of a token prompt again (it never checks whether they were expanded), and
would run its own copy of the processor on raw images. So the sampler hands vLLM an
already-processed multimodal input instead: the trainer's ids unchanged, the trainer's
pixel tensors, and where each image's embeddings go in the ids. The engine then sees
exactly the trainer's tokens and pixels.

Where the embeddings go is a family's own layout; :data:`FAMILIES` lists the families
done here. On CPU, vLLM 0.32 imports transformers' torchvision image processors for
Gemma 3 and LLaVA (``gemma3_mm.py``, ``pixtral.py``), which the CPU install removes:
those models do not start there, whatever the sampler does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from astrai_core.api import ConfigError
from astrai_plugin_vllm.logprobs import is_truncated


def vision_config(model: torch.nn.Module) -> Any:
    """The Hugging Face config of a vision-language policy (transformers backend); None
    for a text model."""
    config = getattr(getattr(model, "hf", None), "config", None)
    return config if getattr(config, "vision_config", None) is not None else None


def image_processor(tokenizer: Any) -> Any:
    """The model's processor (image processor, tokenizer, chat template), from what the
    sampler was given: the processor itself, or a tokenizer loaded from a model directory
    with one (``astrai_processor``, as the trainer's is)."""
    if hasattr(tokenizer, "image_processor"):
        return tokenizer
    return getattr(tokenizer, "astrai_processor", None)


class VisionPolicy:
    """A vision-language policy's Hugging Face config and processor: what the sampler
    needs to hand vLLM its prompts with images."""

    def __init__(self, config: Any, processor: Any) -> None:
        self.config = config
        self.processor = processor

    @classmethod
    def of(cls, model: torch.nn.Module, tokenizer: Any) -> VisionPolicy | None:
        """The policy's, checked (None for a text model)."""
        config = vision_config(model)
        if config is None:
            return None
        processor = image_processor(tokenizer)
        check_family(config.model_type, processor)
        return cls(config, processor)

    def engine_input(self, ids: list[int], images: dict[str, Any]) -> dict[str, Any]:
        """vLLM's processed multimodal input for one prompt: ``ids`` as they are, the
        image tensors of ``images`` (the processor's output for this prompt) and where
        each image's features go."""
        from vllm.inputs.engine import mm_input

        tensors = {name: torch.as_tensor(value) for name, value in images.items()}
        kwargs, hashes, placeholders = FAMILIES[self.config.model_type](
            ids, tensors, self.config, self.processor)
        return mm_input(list(ids), kwargs, {"image": hashes}, {"image": placeholders})


def check_family(model_type: str, processor: Any) -> None:
    """Stop before the engine starts where the sampler cannot feed this family images."""
    if model_type not in FAMILIES:
        raise ConfigError(
            f"sampler: the vllm sampler takes images for {', '.join(sorted(FAMILIES))} "
            f"models; this policy is {model_type!r} (use sampler: {{name: torch}})")
    if processor is None:
        raise ConfigError("sampler: vLLM needs the vision-language model's processor: "
                          "give VllmSampler the tokenizer loaded from the model's directory "
                          "(or the processor itself)")


def check_requests(vision: VisionPolicy | None, requests: Sequence[Any]) -> None:
    """Refuse images the sampler cannot serve, before any reaches the engine."""
    if not any(r.images for r in requests):
        return
    if vision is None:
        raise ValueError("images: this policy is a text model; it takes no images")
    if any(r.images and is_truncated(r.params) for r in requests):
        # such log-probs come from the trainer's forward, which runs no images here
        raise ValueError("images: top_k/top_p/min_p on prompts with images is not "
                         "supported by the vllm sampler; sample them without filters")


def vllm_prompt(vision: VisionPolicy | None, ids: list[int], images: dict[str, Any] | None
                ) -> Any:
    """vLLM's input for one prompt: its token ids, with its images already processed."""
    if not images:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=ids)
    assert vision is not None  # check_requests refused images for a text model
    return vision.engine_input(ids, images)


def generate(engine: Any, prompts: list[Any], params: list[Any],
             lora_request: Any = None) -> list[Any]:
    """The engine's outputs for ``prompts`` (:func:`vllm_prompt`'s), in order, with the
    adapter of ``lora_request`` (text prompts only; None: the engine's weights)."""
    if not any("type" in prompt for prompt in prompts):
        return engine.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
    # Processed multimodal inputs skip vLLM's renderer (which would expand the image
    # tokens again); LLM.generate has no public way in for them in vLLM 0.32.
    from vllm.inputs.engine import tokens_input
    from vllm.outputs import RequestOutput

    inputs = [prompt if "type" in prompt else tokens_input(prompt["prompt_token_ids"])
              for prompt in prompts]
    engine._render_and_add_requests(inputs, params)
    outputs = engine._run_engine(use_tqdm=False, output_type=RequestOutput)  # in order
    for given, output in zip(inputs, outputs, strict=True):
        if list(output.prompt_token_ids) != list(given["prompt_token_ids"]):
            raise RuntimeError("vLLM changed a prompt's token ids (its image expansion "
                               "differs from the trainer's)")
    return outputs


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of ``token`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    for position, value in enumerate(ids):
        if value != token:
            continue
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def _idefics3(ids: list[int], tensors: dict[str, torch.Tensor], config: Any, processor: Any
              ) -> tuple[Any, list[str], list[Any]]:
    """Idefics3: every patch of an image (its tiles, then the whole image after
    ``<global-img>``) is a run of image tokens; the image's embeddings fill them in order."""
    from transformers import BatchFeature
    from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
    from vllm.multimodal.inputs import PlaceholderRange

    token = config.image_token_id
    global_tag = processor.tokenizer.convert_tokens_to_ids(processor.global_image_tag)
    pixels, masks = tensors["pixel_values"], tensors["pixel_attention_mask"]
    if pixels.ndim == 5:  # the processor's [1, patches, 3, H, W] for one prompt
        pixels, masks = pixels[0], masks[0]
    real = pixels.flatten(1).ne(0).any(1)  # all-zero patches pad a batch (as transformers)
    pixels, masks = pixels[real], masks[real]
    images: list[list[tuple[int, int]]] = [[]]
    for start, end in _runs(ids, token):
        images[-1].append((start, end))
        if start > 0 and ids[start - 1] == global_tag:  # the image's last patch
            images.append([])
    images = [runs for runs in images if runs]
    patches = [len(runs) for runs in images]
    if sum(patches) != len(pixels):
        raise ValueError(f"images: the prompt's image tokens hold {sum(patches)} image "
                         f"patches, its pixel_values {len(pixels)}")
    counts = torch.tensor(patches)
    data = BatchFeature({"pixel_values": pixels, "pixel_attention_mask": masks,
                         "num_patches": counts})
    fields = {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", counts),
              "pixel_attention_mask": MultiModalFieldConfig.flat_from_sizes("image", counts),
              "num_patches": MultiModalFieldConfig.batched("image", keep_on_cpu=True)}
    kwargs = MultiModalKwargsItems.from_hf_inputs(data, fields)
    placeholders, hashes, first = [], [], 0
    for runs, count in zip(images, patches, strict=True):
        start, end = runs[0][0], runs[-1][1]
        is_embed = torch.tensor([value == token for value in ids[start:end]])
        placeholders.append(PlaceholderRange(offset=start, length=end - start, is_embed=is_embed))
        hashes.append(_digest(pixels[first:first + count], masks[first:first + count]))
        first += count
    return kwargs, hashes, placeholders


def _digest(*tensors: torch.Tensor) -> str:
    """An image's identity for vLLM's encoder cache: the bytes of its tensors."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# Hugging Face model_type -> (ids, image tensors, model config, processor)
#   -> (vLLM's kwargs items, one hash per image, one placeholder range per image)
FAMILIES: dict[str, Callable[..., tuple[Any, list[str], list[Any]]]] = {
    "idefics3": _idefics3,
}
