"""The test kit's tiny vision-language models: directories that transformers' own
AutoModelForImageTextToText loads, offline, with their processor (transformers' own
AutoProcessor, or the family's processor without its video processor where that needs
torchvision), which expands each image part of a chat into the family's image tokens."""

from __future__ import annotations

import pytest
import torch

from astrai_core.data.processors import load_image_processor
from astrai_core.testing.hf_vlms import TINY_VLM_FAMILIES, tiny_image, write_vlm_dir

CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2=?"},
                                     {"type": "image"}]},
        {"role": "assistant", "content": "4"}]


@pytest.mark.parametrize("family", sorted(TINY_VLM_FAMILIES))
def test_tiny_vlm_directory_loads_and_runs_two_images(tmp_path, family):
    from transformers import AutoModelForImageTextToText

    directory = write_vlm_dir(tmp_path / family, family)
    processor = load_image_processor(directory)
    text = processor.apply_chat_template(CHAT, tokenize=False)
    assert text.count(TINY_VLM_FAMILIES[family].placeholder) == 2
    batch = processor(text=[text], images=[[tiny_image(0), tiny_image(1, (40, 20))]],
                      return_tensors="pt")
    model = AutoModelForImageTextToText.from_pretrained(str(directory), dtype=torch.float32)
    image_id = model.config.image_token_id
    image_tokens = int((batch["input_ids"] == image_id).sum())
    assert image_tokens >= 2 * 4  # each image expanded to its tokens, not one placeholder
    with torch.no_grad():
        logits = model.eval()(**batch).logits
        blank = {**batch, "pixel_values": batch["pixel_values"].flip(-1)}
        other = model(**blank).logits
    assert logits.shape[:2] == batch["input_ids"].shape and torch.isfinite(logits).all()
    # the pixels reach the language model: other pixels, other logits after the first image
    assert not torch.allclose(logits, other)
