"""Tiny grpo runs: the test kit (astrai_core.testing) builds configs and strategies."""

from __future__ import annotations

from pathlib import Path

import pytest

from astrai_core.testing import write_arith_prompts


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    return write_arith_prompts(tmp_path / "prompts.jsonl")
