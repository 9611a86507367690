"""`astrai generate --image FILE` on a vision-language model's checkpoint: greedy output
equals transformers' own greedy ``generate`` on the processor's inputs for the same chat
(images before the text, in order), token for token; a text-only model or an unreadable
file is one error line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir

PROMPT = "1+1=?"
NEW = 10


def _astrai(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astrai_core.cli.main", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module", params=["gemma3", "idefics3"])
def checkpoint(request, tmp_path_factory):
    from astrai_core.checkpoints.hf_model import load_transformers_model, write_backend_record
    from astrai_core.checkpoints.manifest import write_manifest

    root = tmp_path_factory.mktemp("vlm")
    directory = write_vlm_dir(root / request.param, request.param)
    write_backend_record(load_transformers_model(directory), directory)
    write_manifest(directory)  # a checkpoint as a transformers-backend run writes it
    for seed in range(3):
        tiny_image(seed).save(root / f"{seed}.png")
    return directory, root


def _transformers_greedy(directory, seeds):
    """transformers' greedy generate on the processor's tensors for one user message: the
    images of ``seeds``, then the prompt. (prompt ids, new token ids)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(directory))
    model = AutoModelForImageTextToText.from_pretrained(str(directory), dtype=torch.float32)
    content = [{"type": "image"} for _ in seeds] + [{"type": "text", "text": PROMPT}]
    text = processor.apply_chat_template([{"role": "user", "content": content}],
                                         tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=[[tiny_image(s) for s in seeds]],
                       add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.eval().generate(**inputs, do_sample=False, max_new_tokens=NEW)
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt):].tolist(), processor.tokenizer


def test_generate_with_images_equals_transformers_greedy(checkpoint):
    from astrai_core.cli.generate import image_prompt
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.sampling import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler

    directory, root = checkpoint
    outputs = set()
    for seeds in ([0, 1], [2, 1]):
        prompt, expected, tokenizer = _transformers_greedy(directory, seeds)
        # the command's own prompt and sampler, token for token
        ours = load_tokenizer(directory)
        ids, images = image_prompt(ours, PROMPT, [str(root / f"{s}.png") for s in seeds])
        assert ids == prompt
        params = SamplingParams(max_new_tokens=NEW, temperature=0.0,
                                stop_token_ids=(ours.eos_token_id,))
        completion = TorchSampler(load_pretrained(directory), ours).generate(
            [ids], params, images=[images])[0]
        assert completion.token_ids == expected
        # and the command's output: their text
        files = [arg for s in seeds for arg in ("--image", f"{s}.png")]  # relative to cwd
        result = _astrai("generate", str(directory), "--prompt", PROMPT, "--temperature", "0",
                         "--max-new-tokens", str(NEW), *files, cwd=root)
        assert result.returncode == 0, result.stderr[-2000:]
        text = tokenizer.decode(expected, skip_special_tokens=True)
        assert result.stdout == text + "\n"
        outputs.add(tuple(expected))
    assert len(outputs) == 2  # another first image, another answer: the pixels are used


def test_an_unreadable_image_is_one_line_and_exit_code_2(checkpoint, tmp_path):
    directory, _ = checkpoint
    (tmp_path / "notes.png").write_text("not an image")
    for name, reason in (("gone.png", "no such file"), ("notes.png", "not an image file")):
        result = _astrai("generate", str(directory), "--prompt", PROMPT, "--image", name,
                         cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.strip().splitlines() == [
            f"error: --image: image {name} cannot be read ({reason})"]


def test_images_for_a_text_only_model_are_refused(tmp_path):
    from astrai_core.testing.serving import build_checkpoint

    directory = build_checkpoint(tmp_path / "text")
    tiny_image(0).save(tmp_path / "0.png")
    result = _astrai("generate", str(directory), "--prompt", PROMPT, "--image", "0.png",
                     cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: --image: this model takes no images (a text-only model; a vision-language "
        "model's checkpoint has an image processor)"]
