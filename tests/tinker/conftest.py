"""A tiny float32 base model (a Hugging Face llama directory, imported natively) and
helpers to build Tinker engines and datums on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from astrai_core.testing.hf_models import write_hf_model_dir
from astrai_core.tinker.bases import load_base
from astrai_core.tinker.engine import EngineLimits, TorchEngine
from astrai_core.tinker.engine_types import DatumIn

BASE = "tiny/llama"


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_model_dir(tmp_path_factory.mktemp("tinker") / "llama", "llama")


@pytest.fixture
def make_engine(hf_dir: Path, tmp_path: Path):
    """``make_engine(state_dir=None, **limits)``: a fresh engine on its own copy of the base."""

    def make(state_dir: Path | None = None, **limits) -> TorchEngine:
        base = load_base(BASE, str(hf_dir), cache_dir=str(tmp_path / "imports"))
        return TorchEngine([base], state_dir or tmp_path / "state", EngineLimits(**limits))

    return make


def sft_datums(seed: int = 0, lengths: tuple[int, ...] = (9, 6, 4), vocab: int = 60
               ) -> tuple[list[DatumIn], list[np.ndarray], list[np.ndarray]]:
    """(datums, the full rows, their loss masks): row r's datum is row[:-1] -> row[1:]
    with weights = loss_mask[1:] (the first two tokens are a prompt, not trained)."""
    rng = np.random.default_rng(seed)
    datums, rows, masks = [], [], []
    for length in lengths:
        row = rng.integers(1, vocab, length + 1)
        mask = np.ones(length + 1, dtype=np.float32)
        mask[:2] = 0.0
        datums.append(DatumIn([int(t) for t in row[:-1]],
                              {"target_tokens": row[1:].astype(np.int64), "weights": mask[1:]}))
        rows.append(row)
        masks.append(mask)
    return datums, rows, masks


def policy_datums(seed: int = 1, lengths: tuple[int, ...] = (8, 5)) -> list[DatumIn]:
    """Datums for the policy losses: sampler log-probs near the model's, signed advantages."""
    rng = np.random.default_rng(seed)
    datums = []
    for length in lengths:
        tokens = rng.integers(1, 60, length + 1)
        datums.append(DatumIn([int(t) for t in tokens[:-1]], {
            "target_tokens": tokens[1:].astype(np.int64),
            "logprobs": (-4.1 + rng.normal(0, 0.3, length)).astype(np.float32),
            "advantages": rng.normal(0, 1, length).astype(np.float32)}))
    return datums
