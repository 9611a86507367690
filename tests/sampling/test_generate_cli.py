"""`astrai generate` on a tiny saved checkpoint with the arithmetic tokenizer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from astrai_core.checkpoints.native import save_pretrained
from astrai_core.sampling import SamplingParams, TorchSampler

pytestmark = pytest.mark.slow  # starts the CLI in subprocesses


def astrai(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astrai_core.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def checkpoint(char_model_and_tokenizer, char_tokenizer, tmp_path_factory):
    model, _ = char_model_and_tokenizer
    return save_pretrained(model, tmp_path_factory.mktemp("gen") / "ckpt", tokenizer_dir=char_tokenizer[1])


def test_generate_applies_the_chat_template_and_prints_the_greedy_completion(
        checkpoint, char_model_and_tokenizer):
    model, tokenizer = char_model_and_tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": "12+35="}],
                                         add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>")
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(tokenizer.eos_token_id,))
    expected = TorchSampler(model=model, tokenizer=tokenizer).generate([prompt_ids], params)[0].text
    result = astrai("generate", str(checkpoint), "--prompt", "12+35=", "--max-new-tokens", "10",
                    "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"

    raw = astrai("generate", str(checkpoint), "--prompt", "12+35=", "--max-new-tokens", "10",
                 "--temperature", "0", "--no-chat-template")
    raw_ids = tokenizer("12+35=")["input_ids"]
    assert raw.stdout == TorchSampler(model=model, tokenizer=tokenizer).generate([raw_ids], params)[0].text + "\n"


def test_generate_seeded_sampling_equals_the_in_process_sampler(checkpoint, char_model_and_tokenizer):
    model, tokenizer = char_model_and_tokenizer
    result = astrai("generate", str(checkpoint), "--prompt", "7*8=", "--max-new-tokens", "12",
                    "--temperature", "1.0", "--top-k", "5", "--seed", "3", "--no-chat-template")
    assert result.returncode == 0, result.stderr
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=5, seed=3,
                            stop_token_ids=(tokenizer.eos_token_id,))
    expected = TorchSampler(model=model, tokenizer=tokenizer).generate([tokenizer("7*8=")["input_ids"]], params)
    assert result.stdout == expected[0].text + "\n"


def test_generate_on_a_bad_model_dir_is_a_clear_error(tmp_path):
    result = astrai("generate", str(tmp_path / "missing"), "--prompt", "hi")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    bad = astrai("generate", str(tmp_path), "--prompt", "hi", "--top-p", "1.5")
    assert bad.returncode == 2 and "--top-p" in bad.stderr
