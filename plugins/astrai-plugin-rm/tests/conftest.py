"""Tiny reward-model runs: preference data and reward-model checkpoints built here; the test
kit (astrai_core.testing) builds the rest."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from astrai_core import testing


def write_pairs(path: Path, count: int = 16, *, seed: int = 0, margins: bool = False,
                plain: bool = False) -> Path:
    """Preference rows: the right sum chosen over a wrong one (``margin``: how wrong)."""
    rng = random.Random(seed)
    with Path(path).open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(20), rng.randrange(10)
            wrong = a + b + 1 + rng.randrange(90)
            prompt = {"prompt": f"{a}+{b}="} if plain else \
                {"messages": [{"role": "user", "content": f"{a}+{b}="}]}
            row = {**prompt, "chosen": str(a + b), "rejected": str(wrong)}
            if margins:
                row["margin"] = round((wrong - a - b) / 50, 3)
            f.write(json.dumps(row) + "\n")
    return Path(path)


def rm_config(tmp_path: Path, data: Path, eval_data: Path | None = None, **strategy) -> dict:
    """A tiny from-scratch rm run over ``data`` (batch 8), evaluated on ``eval_data``."""
    config = testing.tiny_run_config(tmp_path, data, {"name": "rm", **strategy},
                                     data_format="preference", max_steps=4)
    config["data"]["shuffle"] = False
    config.pop("rewards")
    config.pop("sampler")
    if eval_data is not None:
        config["data"]["eval"] = {"path": str(eval_data), "format": "preference"}
    return config


PAD, EOS = 0, 5  # the arithmetic tokenizer's <pad> and <|end|>
ARCH = {"llama": {}, "qwen2": {"attention_bias": True}, "qwen3": {"qk_norm": True}}


def native_rm(directory: Path, family: str = "llama", seed: int = 0) -> Path:
    """A random native reward model: a backbone of the family over the arithmetic
    tokenizer and a random score head."""
    import torch
    from safetensors.torch import save_file

    from astrai_core.api import CausalLM, ModelConfig, save_pretrained, write_manifest

    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, max_position_embeddings=64,
                         **ARCH[family])
    model = CausalLM(config)
    model.reset_parameters(std=0.2)
    save_pretrained(model, directory, tokenizer_dir=testing.ARITH_TOKENIZER)
    save_file({"weight": torch.randn(1, 32)}, str(Path(directory) / "score.safetensors"))
    write_manifest(Path(directory))  # the score head is part of the checkpoint
    return Path(directory)


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    return write_pairs(tmp_path / "pairs.jsonl")


@pytest.fixture
def rm_kit():
    """The helpers above, for tests (test modules cannot import each other here)."""
    from types import SimpleNamespace

    return SimpleNamespace(write_pairs=write_pairs, rm_config=rm_config, native_rm=native_rm,
                           PAD=PAD, EOS=EOS)
