"""Tiny distill runs: chat data, a teacher checkpoint and a run config (fixtures); the
test kit (astrai_core.testing) builds the rest."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from astrai_core.testing import ARITH_TOKENIZER, TINY_MODEL, tiny_run_config

def write_chats(path: Path, count: int = 16) -> Path:
    """``count`` chat rows "a+b=" -> the sum (a, b < 10, seed 1)."""
    rng = random.Random(1)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(10), rng.randrange(10)
            row = {"messages": [{"role": "user", "content": f"{a}+{b}="},
                                {"role": "assistant", "content": str(a + b)}]}
            f.write(json.dumps(row) + "\n")
    return path


def make_teacher(directory: Path, seed: int = 7, tokenizer_dir: Path = ARITH_TOKENIZER,
                 **overrides: Any) -> Path:
    """A random checkpoint, wider than the tiny student, sharing its tokenizer."""
    import torch
    from tokenizers import Tokenizer

    from astrai_core.api import CausalLM, ModelConfig, save_pretrained

    vocab = Tokenizer.from_file(str(ARITH_TOKENIZER / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(seed)
    fields = {**TINY_MODEL, "hidden_size": 48, "intermediate_size": 96, "vocab_size": vocab,
              **overrides}
    model = CausalLM(ModelConfig(**fields))
    model.reset_parameters(std=0.2)  # a peaked distribution: a teacher worth copying
    return save_pretrained(model, directory, tokenizer_dir=tokenizer_dir)


def _distill_config(tmp_path: Path, chats: Path, teacher: Path, **strategy: Any) -> dict[str, Any]:
    """A tiny distill run config (one conversation per row, unshuffled)."""
    config = tiny_run_config(tmp_path, chats, {"name": "distill", "teacher": str(teacher),
                                               **strategy},
                             data_format="chat", data={"pack": False, "shuffle": False},
                             rewards=[])
    return config


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    return write_chats(tmp_path / "chats.jsonl")


@pytest.fixture
def teacher(tmp_path: Path) -> Path:
    return make_teacher(tmp_path / "teacher")


@pytest.fixture
def distill_config() -> Any:
    """The run-config factory: distill_config(tmp_path, chats, teacher, **strategy)."""
    return _distill_config


@pytest.fixture
def teacher_factory() -> Any:
    """make_teacher(directory, seed=7, tokenizer_dir=..., **model fields)."""
    return make_teacher
