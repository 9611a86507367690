"""Tiny Hugging Face vision-language model directories, built offline.

:func:`write_vlm_dir` saves a randomly initialised transformers image-text-to-text model
of a family (``TINY_VLM_FAMILIES``) with its processor: the arithmetic tokenizer plus the
family's image tokens, the family's PIL image processor, and a chat template that puts
the family's image placeholder where a message holds an image part. A run config points
``model.path`` at it as at a downloaded model; ``AutoProcessor`` and
``AutoModelForImageTextToText`` load it. Imports torch, transformers and PIL; nothing is
downloaded.

The Qwen-VL and SmolVLM processors are left out: transformers builds them with a video
processor, which needs torchvision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_core.testing.hf_models import TINY_FAMILIES
from astrai_core.testing.parity import TINY_COMMON, randomize_
from astrai_core.testing.runs import ARITH_TOKENIZER

VLM_VOCAB = 128  # the arithmetic tokenizer's 55 tokens and a family's image tokens
IMAGE_SIZE = 28  # pixels a side: tiny vision towers see 4 x 4 patches of 7 pixels
PATCH = 7

# The arithmetic chat template, with a content-part list rendered part by part: text as
# it is, an image part (HF's {"type": "image"} or OpenAI's {"type": "image_url"}) as the
# family's placeholder, which the processor expands to the image's tokens.
_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set ns = namespace(text='') -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{%- set ns.text = ns.text + part['text'] -%}"
    "{%- else -%}{%- set ns.text = ns.text + '@IMAGE@' -%}{%- endif -%}"
    "{%- endfor -%}{%- set text = ns.text -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<|assistant|>{% generation %}{{ text }}<|end|>{% endgeneration %}"
    "{%- else -%}<|{{ message['role'] }}|>{{ text }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}")


@dataclass(frozen=True)
class TinyVlmFamily:
    """How one family's tiny model and processor are made."""

    tokens: tuple[str, ...]  # special tokens added to the arithmetic tokenizer
    placeholder: str  # what the chat template writes for an image part
    config: Callable[[dict[str, int]], dict[str, Any]]  # token ids -> config kwargs
    processor: Callable[[Any, str], Any]  # (tokenizer, chat template) -> processor
    extra_special_tokens: dict[str, str] | None = None


def _text(model_type: str) -> dict[str, Any]:
    return {**TINY_COMMON, "vocab_size": VLM_VOCAB, "pad_token_id": 0, "eos_token_id": 5,
            "bos_token_id": None, "model_type": model_type,
            **TINY_FAMILIES.get(model_type, {})}


def _vision(model_type: str, **extra: Any) -> dict[str, Any]:
    return {"model_type": model_type, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": IMAGE_SIZE,
            "patch_size": PATCH, **extra}


def _gemma3_config(ids: dict[str, int]) -> dict[str, Any]:
    return {"text_config": _text("gemma3_text"), "vision_config": _vision("siglip_vision_model"),
            "mm_tokens_per_image": 4, "boi_token_index": ids["<start_of_image>"],
            "eoi_token_index": ids["<end_of_image>"],
            "image_token_index": ids["<image_soft_token>"]}


def _gemma3_processor(tokenizer: Any, template: str) -> Any:
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    images = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return Gemma3Processor(images, tokenizer, chat_template=template, image_seq_length=4)


def _llava_config(ids: dict[str, int]) -> dict[str, Any]:
    return {"text_config": _text("llama"), "vision_config": _vision(
                "clip_vision_model", projection_dim=16),
            "image_token_index": ids["<image>"], "vision_feature_layer": -1,
            "vision_feature_select_strategy": "full", "projector_hidden_act": "gelu"}


def _llava_processor(tokenizer: Any, template: str) -> Any:
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil
    from transformers.models.llava.processing_llava import LlavaProcessor

    images = LlavaImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                    crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                    do_center_crop=False)
    # CLIP's class token is one more position than the 4 x 4 patches
    return LlavaProcessor(images, tokenizer, patch_size=PATCH, chat_template=template,
                          vision_feature_select_strategy="full", num_additional_image_tokens=1)


_IDEFICS3_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>",
                    "<global-img>", *(f"<row_{r}_col_{c}>" for r in range(1, 7)
                                      for c in range(1, 7)))


def _idefics3_config(ids: dict[str, int]) -> dict[str, Any]:
    return {"text_config": _text("llama"), "vision_config": _vision("idefics3_vision"),
            "scale_factor": 2, "image_token_id": ids["<image>"]}


def _idefics3_processor(tokenizer: Any, template: str) -> Any:
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil)
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    # one global image of 28 x 28 pixels, no tiles: (28 / 7)^2 / 2^2 = 4 image tokens
    images = Idefics3ImageProcessorPil(size={"longest_edge": IMAGE_SIZE}, do_image_splitting=False,
                                       max_image_size={"longest_edge": IMAGE_SIZE})
    return Idefics3Processor(images, tokenizer, image_seq_len=4, chat_template=template)


TINY_VLM_FAMILIES: dict[str, TinyVlmFamily] = {
    "gemma3": TinyVlmFamily(("<start_of_image>", "<image_soft_token>", "<end_of_image>"),
                            "<start_of_image>", _gemma3_config, _gemma3_processor,
                            {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>",
                             "eoi_token": "<end_of_image>"}),
    "llava": TinyVlmFamily(("<image>",), "<image>", _llava_config, _llava_processor),
    "idefics3": TinyVlmFamily(_IDEFICS3_TOKENS, "<image>", _idefics3_config,
                              _idefics3_processor),
}


def tiny_vlm_tokenizer(family: str) -> Any:
    """The arithmetic tokenizer with ``family``'s image tokens (ids from 55 up)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = TINY_VLM_FAMILIES[family]
    tokenizer = Tokenizer.from_file(str(ARITH_TOKENIZER / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in spec.tokens])
    extra = {"extra_special_tokens": spec.extra_special_tokens} if spec.extra_special_tokens \
        else {}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>",
                                   unk_token="<unk>", eos_token="<|end|>", **extra)


def tiny_vlm_processor(family: str) -> Any:
    """``family``'s processor over :func:`tiny_vlm_tokenizer`, with the chat template."""
    spec = TINY_VLM_FAMILIES[family]
    template = _TEMPLATE.replace("@IMAGE@", spec.placeholder)
    tokenizer = tiny_vlm_tokenizer(family)
    tokenizer.chat_template = template
    return spec.processor(tokenizer, template)


def tiny_vlm(family: str, seed: int = 0, **text: Any) -> Any:
    """A randomly initialised float32 image-text-to-text model of ``family`` (tiny);
    ``text``: language-model config values over the tiny ones (an engine may need a
    wider head: vLLM's CPU attention wants ``head_dim`` >= 32)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    spec = TINY_VLM_FAMILIES[family]
    ids = tiny_vlm_tokenizer(family).get_vocab()
    kwargs = spec.config(ids)
    text = {**kwargs.pop("text_config"), **text}
    vision = dict(kwargs.pop("vision_config"))
    config = AutoConfig.for_model(
        family, text_config=AutoConfig.for_model(text.pop("model_type"), **text),
        vision_config=AutoConfig.for_model(vision.pop("model_type"), **vision), **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    return randomize_(model, seed, std=0.05).eval()


def write_vlm_dir(directory: Path, family: str, seed: int = 0, **text: Any) -> Path:
    """A Hugging Face directory (safetensors, config, processor, tokenizer, chat template)
    of a tiny random ``family`` vision-language model (``text``: see :func:`tiny_vlm`)."""
    directory = Path(directory)
    tiny_vlm(family, seed, **text).save_pretrained(str(directory))
    tiny_vlm_processor(family).save_pretrained(str(directory))
    return directory


def tiny_image(seed: int = 0, size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> Any:
    """A random RGB PIL image (width, height)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)



def write_image_chats(directory: Path, rows: int = 8) -> Path:
    """``chat.jsonl`` in ``directory``: ``rows`` one-turn chats "<image>i+1=?" -> "i+1",
    each with its own PNG (``i.png``, beside the file, referenced by a relative path in
    OpenAI's image_url shape)."""
    import json

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(rows):
        tiny_image(i).save(directory / f"{i}.png")
        user = [{"type": "image_url", "image_url": {"url": f"{i}.png"}},
                {"type": "text", "text": f"{i}+1=?"}]
        lines.append(json.dumps({"messages": [{"role": "user", "content": user},
                                              {"role": "assistant", "content": str(i + 1)}]}))
    path = directory / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
