"""Loading tokenizers with clear errors, and the tokenizer fingerprint of the cache key."""

from __future__ import annotations

import shutil

import pytest

from astrai_core.data import load_tokenizer
from astrai_core.data.tokenizer import tokenizer_fingerprint
from astrai_core.errors import DataError

from .conftest import ARITH_TOKENIZER


def test_directory_without_tokenizer_files_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(DataError, match="no tokenizer files in"):
        load_tokenizer(tmp_path)
    with pytest.raises(DataError, match="tokenizer directory not found"):
        load_tokenizer(tmp_path / "missing")


def test_broken_tokenizer_file_is_an_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="cannot load the tokenizer"):
        load_tokenizer(tmp_path)


def test_fingerprint_follows_the_files(tmp_path):
    copy = tmp_path / "tok"
    shutil.copytree(ARITH_TOKENIZER, copy)
    original = tokenizer_fingerprint(load_tokenizer(ARITH_TOKENIZER))
    assert tokenizer_fingerprint(load_tokenizer(copy)) == original  # location does not matter
    template = copy / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|end|>{% endgeneration %}",
                                                     "{% endgeneration %}<|end|>"))
    assert tokenizer_fingerprint(load_tokenizer(copy)) != original
