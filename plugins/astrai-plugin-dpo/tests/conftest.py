"""Tiny dpo runs: preference data here; the test kit (astrai_core.testing) builds the rest."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch


def write_pairs(path: Path, count: int = 8) -> Path:
    """Preference rows: the right sum (of varying length) chosen over a wrong one."""
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(20), rng.randrange(10)
            row = {"messages": [{"role": "user", "content": f"{a}+{b}="}],
                   "chosen": str(a + b), "rejected": str(a + b + 1 + rng.randrange(90))}
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    """Eight preference rows in ``tmp_path/pairs.jsonl``."""
    return write_pairs(tmp_path / "pairs.jsonl")


def write_unpaired(path: Path, count: int = 8) -> Path:
    """Unpaired rows: a sum, right (label true) on even rows and wrong on odd rows."""
    rng = random.Random(1)
    with path.open("w") as f:
        for i in range(count):
            a, b = rng.randrange(20), rng.randrange(10)
            answer = a + b if i % 2 == 0 else a + b + 1 + rng.randrange(90)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(answer),
                                "label": i % 2 == 0}) + "\n")
    return path


@pytest.fixture
def unpaired_file(tmp_path: Path) -> Path:
    """Eight unpaired rows in ``tmp_path/unpaired.jsonl``."""
    return write_unpaired(tmp_path / "unpaired.jsonl")


def _direct_response_logprob(model, ids, attention, loss_mask):
    """Sum of log p(token) over loss-mask tokens, on the row with its padding cut off."""
    keep = attention.bool()
    ids, loss_mask = ids[keep], loss_mask[keep]
    logits = model(ids[None])["logits"][0].double()
    logps = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    return logps[loss_mask[1:]].sum()


@pytest.fixture
def direct_logprob():
    """direct_logprob(model, ids, attention, loss_mask): a response's summed log-prob from
    an unpadded single-row forward in float64 (independent of the strategies' code)."""
    return _direct_response_logprob
