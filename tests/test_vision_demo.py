"""The vision demo (examples/vision): the pictures' answers are what their pixels show,
the data is the same for a seed, the held-out layouts are never trained on, and the
demo's stages run end to end at a reduced size with an accuracy that equals
transformers' own greedy answers scored by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from astrai_core.testing import REPO_ROOT, read_metrics

VISION = REPO_ROOT / "examples" / "vision"
sys.path.insert(0, str(REPO_ROOT / "examples"))
from stages import run_stages  # noqa: E402  (examples/stages.py)


def _example(name: str):
    """examples/vision/<name>.py under a name of its own (the other examples have files
    of the same names)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"vision_{name}", VISION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _example("generate")


def _generate(out: Path, seed: int = 0) -> Path:
    subprocess.run([sys.executable, str(VISION / "generate.py"), "--out", str(out), "--seed",
                    str(seed), "--n-train", "60", "--n-eval", "20", "--n-rl", "20"],
                   check=True, capture_output=True)
    return out


def _rows(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


def _image(row: dict) -> str:
    return row["messages"][0]["content"][0]["image_url"]["url"]


def _red_squares(path: Path) -> int:
    """Connected components of red pixels, counted independently of the generator."""
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 100) & (pixels[..., 2] < 100)
    seen = np.zeros_like(red)
    components = 0
    for start in zip(*np.nonzero(red)):
        if seen[start]:
            continue
        components += 1
        stack = [start]
        while stack:  # flood fill over 4-neighbours
            y, x = stack.pop()
            if 0 <= y < red.shape[0] and 0 <= x < red.shape[1] and red[y, x] and not seen[y, x]:
                seen[y, x] = True
                stack += [(y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)]
    return components


def test_answers_count_the_red_squares_and_the_data_is_seeded(tmp_path):
    first, again, other = (_generate(tmp_path / name, seed)
                           for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    for name in ("sft_train", "eval", "rl_prompts"):
        assert (first / f"{name}.jsonl").read_text() == (again / f"{name}.jsonl").read_text()
    pictures = sorted(p.name for p in (first / "images").iterdir())
    assert pictures == sorted(p.name for p in (again / "images").iterdir())
    assert all((first / "images" / p).read_bytes() == (again / "images" / p).read_bytes()
               for p in pictures)
    assert (other / "images" / pictures[0]).read_bytes() != (first / "images" / pictures[0]).read_bytes()
    answers = [(_image(r), r["messages"][1]["content"]) for r in _rows(first, "sft_train")]
    answers += [(_image(r), r["answer"]) for r in _rows(first, "eval") + _rows(first, "rl_prompts")]
    assert len(answers) == 100
    for image, answer in answers:
        assert str(_red_squares(first / image)) == answer, image
    assert {answer for _, answer in answers} == {"1", "2", "3", "4"}


def test_held_out_layouts_are_never_trained_on():
    import random

    rng = random.Random(0)
    held_out = generate.draw_layouts(rng, 60, set())
    train = generate.draw_layouts(rng, 3000, set(held_out))
    assert len(set(held_out)) > 50 and not set(held_out) & set(train)
    # the check bites: drawn without it, the training layouts repeat held-out ones
    assert set(held_out) & set(generate.draw_layouts(random.Random(1), 3000, set()))


def _transformers_answers(checkpoint: Path, data: Path) -> list[str]:
    """transformers' own greedy answers (generate) to the prompts of ``data``."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(checkpoint))
    model = AutoModelForImageTextToText.from_pretrained(str(checkpoint), dtype=torch.float32)
    answers = []
    for row in _rows(data.parent, data.stem):
        chat = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": generate.QUESTION}]}]
        text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        image = Image.open(data.parent / _image(row)).convert("RGB")
        inputs = processor(text=[text], images=[[image]], add_special_tokens=False,
                           return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=4, do_sample=False,
                                 eos_token_id=processor.tokenizer.eos_token_id)
        answers.append(processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                                  skip_special_tokens=True))
    return answers


@pytest.mark.slow
def test_the_demo_runs_end_to_end_and_scores_as_transformers_does(tmp_path, monkeypatch):
    demo = _example("demo")
    monkeypatch.chdir(tmp_path)  # the demo's paths are relative to the working directory
    steps = {"sft": 100, "grpo": 2}  # 100: its answers already depend on the picture
    seconds = run_stages(demo.stages(sys.executable, steps, ("--n-train", "200", "--n-eval",
                                                             "24", "--n-rl", "16")), jobs=2)
    assert set(seconds) == {f"vision/{stage}" for stage in (
        "data", "base", "sft", "grpo", "eval-base", "eval-sft", "eval-grpo")}
    rewards = [r["rollout/reward/exact_match"] for r in read_metrics(demo.OUT / "grpo")]
    assert len(rewards) == 2 and 0 < sum(rewards)  # right counts were sampled and rewarded
    summary = demo.eval_summary("vision", list(demo.checkpoints(steps)), demo.OUT, seconds)
    assert summary["base"]["accuracy"] == 0.0 and summary["base"]["prompts"] == 24
    checkpoint = demo.checkpoints(steps)["sft"]
    data = demo.OUT / "data" / "eval.jsonl"
    answers = _transformers_answers(checkpoint, data)
    assert all(answer.isdigit() for answer in answers) and len(set(answers)) > 1, answers
    right = [answer == row["answer"] for answer, row in zip(answers, _rows(data.parent, "eval"))]
    assert summary["sft"]["accuracy"] == pytest.approx(sum(right) / len(right))
    assert 0 <= summary["grpo"]["accuracy"] <= 1
