"""Held-out accuracy of a vision demo checkpoint: greedy answers to pictures, exact match.

Run: ``python examples/vision/evaluate.py runs/vision/sft/checkpoints/step_400`` (or
``runs/vision/base``, the untrained model: any Hugging Face VLM directory). Each
held-out prompt (its picture and question) goes through the checkpoint's processor, the
torch sampler decodes it greedily with the picture's pixels, and the ``exact_match``
reward (the GRPO stage's) scores the answer against the row's ``answer``. Prints one
JSON line (``--json``: also writes it to a file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from calc.evaluate import evaluation_main  # noqa: E402  (examples/calc/evaluate.py)

EVAL = Path("runs/vision/data/eval.jsonl")
MAX_NEW_TOKENS = 4
BATCH = 50


def image_prompts(processor, path: Path) -> tuple[list[list[int]], list[dict], list[str]]:
    """(prompt ids, image inputs, answer) of every prompt row of ``path``, rendered as
    the sampler takes them; images are read relative to the data file."""
    from astrai_core.data.images import open_row_images, split_images
    from astrai_core.data.vision_render import process_prompt

    ids, images, answers = [], [], []
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        row = json.loads(line)
        messages, sources = split_images(row["messages"], row.get("images"))
        pictures = open_row_images(sources, path.parent, f"{path}, line {line_number}")
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids, inputs = process_prompt(processor, text, pictures)
        ids.append(prompt_ids)
        images.append(inputs)
        answers.append(row["answer"])
    return ids, images, answers


def accuracy(checkpoint: Path, data: Path = EVAL) -> dict[str, float]:
    """The share of held-out prompts whose greedy answer is right."""
    import torch

    from astrai_core.api import load_tokenizer
    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_core.rewards.builtin import exact_match
    from astrai_core.sampling.params import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler

    torch.set_num_threads(1)  # as the trainer pins it (trainer.threads): the same numbers
    tokenizer = load_tokenizer(checkpoint)
    ids, images, answers = image_prompts(tokenizer.astrai_processor, data)
    sampler = TorchSampler(load_transformers_model(checkpoint), tokenizer)
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=0.0,
                            stop_token_ids=(tokenizer.eos_token_id,))
    texts: list[str] = []
    for start in range(0, len(ids), BATCH):
        completions = sampler.generate(ids[start:start + BATCH], params,
                                       images=images[start:start + BATCH])
        texts += [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    right = exact_match([""] * len(texts), texts, answer=answers)
    return {"accuracy": sum(right) / len(right), "prompts": len(right)}


def main() -> None:
    evaluation_main(__doc__.splitlines()[0], EVAL, accuracy)


if __name__ == "__main__":
    main()
