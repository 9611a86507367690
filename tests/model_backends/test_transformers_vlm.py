"""Vision-language models through the transformers backend: a Hugging Face VLM directory
loads with AutoModelForImageTextToText, its log-probs on an image+text batch are
transformers' own forward's, ``model.freeze`` keeps the vision tower out of training by
default, and LoRA adapts the language model only."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.hf_model import load_transformers_model
from astrai_core.config.schema import ModelSection
from astrai_core.data.processors import load_image_processor
from astrai_core.model.masks import positions_from_attention_mask
from astrai_core.model_backends.vision import IMAGE_INPUTS, freeze_parts, part_modules
from astrai_core.testing.hf_vlms import TINY_VLM_FAMILIES, tiny_image, write_vlm_dir

CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2=?"},
                                     {"type": "image"}]},
        {"role": "assistant", "content": "4"}]


def _batch(directory):
    processor = load_image_processor(directory)
    text = processor.apply_chat_template(CHAT, tokenize=False)
    short = processor.apply_chat_template(CHAT[:1], tokenize=False)
    images = [[tiny_image(0), tiny_image(1, (40, 20))], [tiny_image(2), tiny_image(3)]]
    processor.tokenizer.padding_side = "right"
    return processor(text=[text, short], images=images, padding=True, return_tensors="pt")


@pytest.mark.parametrize("family", sorted(TINY_VLM_FAMILIES))
def test_backend_logprobs_equal_transformers_forward(tmp_path, family):
    from transformers import AutoModelForImageTextToText

    directory = write_vlm_dir(tmp_path / family, family)
    batch = _batch(directory)
    ours = load_transformers_model(directory)
    theirs = AutoModelForImageTextToText.from_pretrained(str(directory), dtype=torch.float32)
    images = {k: v for k, v in batch.items() if k in IMAGE_INPUTS}
    ids, mask = batch["input_ids"], batch["attention_mask"]
    targets = ids[:, 1:]
    with torch.no_grad():
        full = theirs.eval()(**batch).logits
        expected = torch.log_softmax(full[:, :-1], -1).gather(-1, targets[..., None])[..., 0]
        logits = ours(ids, attention_mask=mask, images=images)["logits"]
        # as the trainer calls it, with the rows' positions (M-RoPE's are the images')
        placed = ours(ids, attention_mask=mask, position_ids=positions_from_attention_mask(mask),
                      images=images)["logits"]
        out = ours(ids, attention_mask=mask, target_ids=targets, images=images)
        blind = ours(ids, attention_mask=mask, target_ids=targets)
    assert torch.equal(logits[mask.bool()], full[mask.bool()])  # the same numbers, exactly
    assert torch.equal(placed[mask.bool()], full[mask.bool()])
    valid = mask[:, 1:].bool()  # the chunked head's log-softmax: float rounding apart
    torch.testing.assert_close(out["logprobs"][valid], expected[valid], rtol=0, atol=1e-5)
    # without the pixels the image tokens are plain embeddings: other numbers
    assert not torch.allclose(blind["logprobs"][valid], expected[valid])


@pytest.mark.parametrize("family", sorted(TINY_VLM_FAMILIES))
def test_vision_tower_is_frozen_by_default_and_can_train(tmp_path, family):
    assert ModelSection(path="x").freeze == ["vision"]
    model = load_transformers_model(write_vlm_dir(tmp_path / family, family)).hf
    parts = {part: {id(p) for _, m in part_modules(model, part) for p in m.parameters()}
             for part in ("vision", "projector")}
    parts["language"] = {id(p) for p in model.get_decoder().parameters()}
    parts["head"] = {id(model.get_output_embeddings().weight)}
    # every weight in one part: Qwen-VL's mergers (inside its vision tower) are the projector
    every = [p for _, p in model.named_parameters()]
    assert sum(len(ids) for ids in parts.values()) - len(parts["head"] & parts["language"]) \
        == len(every) == len(set.union(*parts.values()))
    names = {id(p): name for name, p in model.named_parameters()}
    assert all("merger" not in names[i] for i in parts["vision"])
    if family.startswith("qwen"):
        assert all(".merger." in names[i] or "deepstack" in names[i] for i in parts["projector"])
    frozen = freeze_parts(model, ModelSection(path="x").freeze)
    vision = [p for p in every if id(p) in parts["vision"]]
    assert vision and parts["projector"]
    assert frozen == sum(p.numel() for p in vision)
    assert [p for p in every if not p.requires_grad] == vision


def test_freeze_leaves_a_text_model_alone(tmp_path):
    from astrai_core.testing.hf_models import write_hf_model_dir

    model = load_transformers_model(write_hf_model_dir(tmp_path / "t", "llama")).hf
    assert freeze_parts(model, ["vision", "projector"]) == 0
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("family", ["gemma3", "qwen2_5_vl", "qwen3_vl", "smolvlm"])
@pytest.mark.parametrize("target_modules", [None, "all-linear", ["q_proj", "v_proj"]])
def test_lora_adapts_the_language_model_only(tmp_path, family, target_modules):
    from astrai_core.checkpoints.lora_files import attach_lora
    from astrai_core.config.lora import LoraSection

    # SigLIP's attention has q_proj/k_proj/v_proj too, Qwen-VL's vision blocks the
    # language model's MLP names: by leaf name alone peft adapts them
    model = load_transformers_model(write_vlm_dir(tmp_path / family, family))
    lora = {"r": 2, "alpha": 4} | ({} if target_modules is None
                                   else {"target_modules": target_modules})
    model = attach_lora(model, LoraSection(**lora), None)
    adapted = {name for name, p in model.named_parameters() if "lora_" in name}
    assert adapted
    language = {id(p) for p in model.hf.get_decoder().parameters()}
    assert all(id(p) in language for name, p in model.named_parameters() if "lora_" in name), \
        sorted(adapted)[:3]
    if target_modules == ["q_proj", "v_proj"]:
        assert {n.split(".lora_")[0].rpartition(".")[2] for n in adapted} == {"q_proj", "v_proj"}
