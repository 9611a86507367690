"""SFT of a vision-language model on chats with images: the first step's loss is
transformers' own mean cross-entropy over the assistant's tokens of those rows (the
pixels reach the model), the loss falls, the vision tower stays as it was (model.freeze)
while the rest trains; and a missing image stops `astrai train` before training with one
line naming the file, the line and the image (exit code 2)."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.config.schema import RunConfig
from astrai_core.testing.hf_vlms import tiny_image, write_image_chats, write_vlm_dir
from astrai_core.testing.runs import read_metrics
from astrai_core.training.run import train
from tests.training.conftest import assert_a_missing_image_stops_the_run

STEPS = 8


def vlm_config(tmp_path, family: str, steps: int = STEPS) -> dict:
    model = write_vlm_dir(tmp_path / "model", family)
    data = write_image_chats(tmp_path / "data")
    return {"output_dir": str(tmp_path / "run"), "model": {"path": str(model)},
            "data": {"sources": [{"path": str(data), "format": "chat"}], "seq_len": 64,
                     "batch_size": 4, "shuffle": False, "cache_dir": str(tmp_path / "cache")},
            "strategy": {"name": "sft"}, "device": {"name": "cpu"},
            "trainer": {"max_steps": steps, "lr": 1e-2, "warmup_steps": 0, "save_every": steps,
                        "eval_every": 0, "eval_at_start": False, "threads": 1,
                        "progress": False}}


def _reference_first_loss(model_dir) -> float:
    """transformers' model and processor on the first 4 rows: mean NLL of the answers."""
    from transformers import AutoModelForImageTextToText

    from astrai_core.data.processors import load_image_processor

    processor = load_image_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    total, count = 0.0, 0
    for i in range(4):
        chat = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": f"{i}+1=?"}]},
                {"role": "assistant", "content": str(i + 1)}]
        text = processor.apply_chat_template(chat, tokenize=False)
        batch = processor(text=[text], images=[[tiny_image(i)]], return_tensors="pt")
        answer = len(processor.tokenizer(f"{i + 1}<|end|>", add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logits = model.train()(**batch).logits[0, -answer - 1:-1]
        targets = batch["input_ids"][0, -answer:]
        total += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        count += answer
    return total / count


@pytest.mark.parametrize("family", ["gemma3", "llava", "idefics3", "qwen2_5_vl", "qwen3_vl",
                                    "smolvlm"])
def test_sft_on_image_chats_matches_transformers_and_trains(tmp_path, family):
    from transformers import AutoModelForImageTextToText

    from astrai_core.model_backends.vision import part_modules

    config = vlm_config(tmp_path, family)
    train(RunConfig.model_validate(config))
    losses = [record["loss"] for record in read_metrics(tmp_path / "run")]
    assert len(losses) == STEPS
    assert losses[0] == pytest.approx(_reference_first_loss(tmp_path / "model"), abs=1e-5)
    assert losses[-1] < 0.7 * losses[0]
    before, after = (AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
                     for path in (tmp_path / "model",
                                  tmp_path / "run" / "checkpoints" / f"step_{STEPS}"))
    for part, trained in (("vision", False), ("projector", True)):
        old = [p for _, module in part_modules(before, part) for p in module.parameters()]
        new = [p for _, module in part_modules(after, part) for p in module.parameters()]
        same = all(torch.equal(a, b) for a, b in zip(old, new, strict=True))
        assert old and same != trained, part
    old, new = before.get_decoder(), after.get_decoder()
    assert not all(torch.equal(a, b) for a, b in zip(old.parameters(), new.parameters()))
    # the checkpoint carries the processor: it trains on image rows as model.path
    from astrai_core.data.tokenizer import load_tokenizer

    step = tmp_path / "run" / "checkpoints" / f"step_{STEPS}"
    processor = load_tokenizer(step).astrai_processor
    assert processor.to_json_string() == load_tokenizer(tmp_path / "model"
                                                        ).astrai_processor.to_json_string()


def test_a_missing_image_is_one_line_and_exit_code_2(tmp_path):
    config = vlm_config(tmp_path, "llava", steps=2)
    assert_a_missing_image_stops_the_run(tmp_path, config, tmp_path / "data" / "chat.jsonl")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_packing_image_rows_is_refused_when_asked_for(tmp_path):
    from astrai_core.errors import DataError

    config = vlm_config(tmp_path, "llava", steps=1)
    config["data"]["pack"] = True
    with pytest.raises(DataError, match="has rows with images, which are not packed"):
        train(RunConfig.model_validate(config))


# (family, the loss after 8 steps at most this fraction of the first: the tiny Qwen
# learns slower at the same rate, 0.81 of it)
@pytest.mark.parametrize("family, falls_to", [("gemma3", 0.8), ("qwen2_5_vl", 0.85)])
def test_lora_sft_adapts_the_language_model_and_loads_in_peft(tmp_path, family, falls_to):
    """The default LoRA targets are the language model's projections (not SigLIP's
    q_proj/k_proj/v_proj, nor Qwen-VL's vision MLPs), the run trains, and peft loads the
    adapter on transformers' model with astrai's logits on an image batch."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from astrai_core.api import load_pretrained
    from astrai_core.data.processors import load_image_processor

    config = vlm_config(tmp_path, family)
    config["model"]["lora"] = {"r": 4, "alpha": 8}
    config["trainer"]["lr"] = 3e-2
    train(RunConfig.model_validate(config))
    losses = [record["loss"] for record in read_metrics(tmp_path / "run")]
    assert losses[-1] < falls_to * losses[0]
    step = tmp_path / "run" / "checkpoints" / f"step_{STEPS}"
    targets = json.loads((step / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert targets and all(t.startswith("model.language_model.") for t in targets)

    processor = load_image_processor(tmp_path / "model")
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "3+1=?"}]}]
    text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    batch = processor(text=[text], images=[[tiny_image(3)]], return_tensors="pt")
    base = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "model"),
                                                       dtype=torch.float32)
    reference = PeftModel.from_pretrained(base, str(step / "adapter")).eval()
    ours = load_pretrained(step).eval()
    images = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask")}
    with torch.no_grad():
        expected = reference(**batch).logits
        got = ours(batch["input_ids"], attention_mask=batch["attention_mask"],
                   images=images)["logits"]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
