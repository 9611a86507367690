"""Tiny dpo runs: preference data here; the test kit (astrai_core.testing) builds the rest."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest


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
