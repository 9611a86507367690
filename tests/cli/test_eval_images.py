"""`astrai eval` on prompts with images, on vision-language model checkpoints: every
completion, generated in batches of prompts with and without images, is transformers'
own greedy ``generate`` for that prompt alone on the processor's inputs (a reward
checks each against it: accuracy 1); prompts with images cannot be trained on by
rollouts yet, which says so."""

from __future__ import annotations

import base64
import io
import json

import pytest
import structlog
import torch

from astrai_core.cli.main import main
from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir

QUESTION = "What is this?"
NEW = 6
REWARD_MODULE = '''
def same_text(prompts, completions, expected=None, **columns):
    """1 when the completion is the expected text exactly."""
    return [float(c == e) for c, e in zip(completions, expected, strict=True)]
'''


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def _part(directory, i):
    """Row i's image part in one of the shapes a prompt may give it, and its extra fields."""
    tiny_image(i, (28 + 4 * i, 28)).save(directory / f"{i}.png")
    if i % 3 == 0:
        return {"type": "image_url", "image_url": {"url": f"{i}.png"}}, {}
    if i % 3 == 1:
        return {"type": "image"}, {"images": [f"{i}.png"]}
    url = "data:image/png;base64," + base64.b64encode((directory / f"{i}.png").read_bytes()
                                                      ).decode()
    return {"type": "image_url", "image_url": {"url": url}}, {}


def _transformers_greedy(model_dir, content, images):
    """transformers' greedy completion text of one user message, alone."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    text = processor.apply_chat_template([{"role": "user", "content": content}],
                                         tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=[images] if images else None,
                       add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.eval().generate(**inputs, do_sample=False, max_new_tokens=NEW)
    new = out[0, inputs["input_ids"].shape[1]:]
    return processor.tokenizer.decode(new, skip_special_tokens=True)


def _write_prompts(directory, model_dir, rows=4):
    """``rows`` prompts with an image each (the same question) and one without, each with
    transformers' greedy completion as ``expected``."""
    lines = []
    for i in range(rows):
        part, extra = _part(directory, i)
        content = [part, {"type": "text", "text": QUESTION}]
        plain = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        expected = _transformers_greedy(model_dir, plain, [tiny_image(i, (28 + 4 * i, 28))])
        lines.append({"messages": [{"role": "user", "content": content}],
                      "expected": expected, **extra})
    text_only = [{"type": "text", "text": "1+1=?"}]
    lines.insert(2, {"messages": [{"role": "user", "content": "1+1=?"}],
                     "expected": _transformers_greedy(model_dir, text_only, None)})
    path = directory / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, lines


@pytest.mark.parametrize("family", ["gemma3", "idefics3"])
def test_eval_on_image_prompts_equals_transformers_greedy(tmp_path, capsys, monkeypatch,
                                                          family):
    from astrai_core.checkpoints.hf_model import load_transformers_model, write_backend_record
    from astrai_core.checkpoints.manifest import write_manifest

    model_dir = write_vlm_dir(tmp_path / family, family)
    write_backend_record(load_transformers_model(model_dir), model_dir)
    write_manifest(model_dir)
    data, rows = _write_prompts(tmp_path, model_dir)
    image_answers = [r["expected"] for r in rows if r["messages"][0]["content"] != "1+1=?"]
    assert len(set(image_answers)) > 1  # the images decide the answers: a real check
    (tmp_path / "eval_images_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-format", "json", "eval", str(model_dir), "--data", str(data),
              "--rewards", "eval_images_rewards:same_text", "--max-new-tokens", str(NEW),
              "--batch-size", "5", "--cache-dir", str(tmp_path / "cache")])
    assert exit_info.value.code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["prompts"] == len(rows)
    assert metrics["eval/accuracy"] == 1.0, metrics
