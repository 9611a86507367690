"""Reward models to and from Hugging Face sequence classifiers: the same scores both ways."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astrai_core.testing import ARITH_TOKENIZER
from astrai_plugin_rm.checkpoint import load_reward_model
from astrai_plugin_rm.hf import export_reward_model, import_reward_model

PAD, EOS = 0, 5  # the arithmetic tokenizer's <pad> and <|end|>

def _batch():
    """Right-padded rows of different lengths: ending in EOS, in a plain token, and in the
    pad id itself (attended), which both sides then skip when pooling."""
    rows = [[1, 9, 12, 30, EOS], [7, 3, 40], [4, 22, 17, 9, 8, 33, 2, EOS], [6, 14, 21, PAD]]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def _hf_scores(hf_dir: Path, ids, mask):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_export_scores_like_transformers(tmp_path, family, rm_kit):
    native = rm_kit.native_rm(tmp_path / "rm", family)
    hf_dir = export_reward_model(native, tmp_path / "hf")
    config = (hf_dir / "config.json").read_text()
    assert f'"pad_token_id": {PAD}' in config and "ForSequenceClassification" in config
    ids, mask = _batch()
    model, _ = load_reward_model(native)
    with torch.no_grad():
        ours = model(ids, mask)
    theirs = _hf_scores(hf_dir, ids, mask)
    assert ours.std() > 0.1  # the rows score differently: the comparison means something
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # each row scores alone as in the batch (padding does not leak into the score)
    for row in range(len(ids)):
        keep = mask[row].bool()
        alone = model(ids[row][keep][None], mask[row][keep][None])
        torch.testing.assert_close(alone[0], ours[row], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_import_scores_like_transformers(tmp_path, family):
    import transformers

    torch.manual_seed(1)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  num_labels=1, pad_token_id=PAD)
    if family == "llama":
        hf_model = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(**common))
    else:
        hf_model = transformers.Qwen3ForSequenceClassification(
            transformers.Qwen3Config(head_dim=8, **common))
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "norm" not in name:  # norms stay ones: the scores then spread
                param.normal_(0.0, 0.2)
    hf_dir = tmp_path / "hf"
    hf_model.save_pretrained(hf_dir)
    for path in ARITH_TOKENIZER.iterdir():
        shutil.copy2(path, hf_dir / path.name)
    native = import_reward_model(hf_dir, tmp_path / "rm")
    model, _ = load_reward_model(native)
    ids, mask = _batch()
    with torch.no_grad():
        ours = model(ids, mask)
    theirs = _hf_scores(hf_dir, ids, mask)
    assert theirs.std() > 0.1
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # and back again: the re-export scores the same
    again = export_reward_model(native, tmp_path / "hf2")
    torch.testing.assert_close(_hf_scores(again, ids, mask), theirs, atol=1e-5, rtol=0)


def test_command_line_and_its_errors(tmp_path, rm_kit):
    native = rm_kit.native_rm(tmp_path / "rm", "llama")
    run = [sys.executable, "-m", "astrai_plugin_rm"]
    done = subprocess.run(run + ["export", str(native), str(tmp_path / "hf")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    # a plain language-model checkpoint is not a reward model: one line, exit 2
    (native / "score.safetensors").unlink()
    failed = subprocess.run(run + ["export", str(native), str(tmp_path / "hf3")],
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2
    assert failed.stderr.strip().count("\n") == 0 and "no score.safetensors" in failed.stderr
    assert not (tmp_path / "hf3").exists()
    # a causal LM directory is not a sequence classifier
    failed = subprocess.run(run + ["import", str(tmp_path / "hf"), str(tmp_path / "rm2")],
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode == 0, failed.stderr  # the exported classifier imports
    bad = tmp_path / "hf" / "config.json"
    bad.write_text(bad.read_text().replace("ForSequenceClassification", "ForCausalLM"))
    failed = subprocess.run(run + ["import", str(tmp_path / "hf"), str(tmp_path / "rm3")],
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2 and "not a one-label sequence classifier" in failed.stderr
