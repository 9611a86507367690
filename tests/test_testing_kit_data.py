"""The test kit's tokenizer is package data, identical to the example's."""

from __future__ import annotations

from pathlib import Path

import pytest

import astrai_core
from astrai_core.testing import ARITH_TOKENIZER

EXAMPLE_TOKENIZER = Path(__file__).resolve().parents[1] / "examples" / "arith" / "tokenizer"


def test_kit_tokenizer_lives_in_the_package_and_matches_the_example():
    package = Path(astrai_core.__file__).resolve().parent
    assert ARITH_TOKENIZER.is_relative_to(package)
    shipped = sorted(p.name for p in ARITH_TOKENIZER.iterdir())
    assert shipped == sorted(p.name for p in EXAMPLE_TOKENIZER.iterdir())
    for name in shipped:
        assert (ARITH_TOKENIZER / name).read_bytes() == (EXAMPLE_TOKENIZER / name).read_bytes(), name


def test_package_data_declares_the_kit_tokenizer():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((EXAMPLE_TOKENIZER.parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["astrai_core"]
    assert "testing_data/arith_tokenizer/*" in globs
