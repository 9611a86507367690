"""Tokenize once: the second run loads the memory-mapped cache without tokenizing."""

from __future__ import annotations

import os

import numpy as np
import pytest

from astrai_core.data import render
from astrai_core.data.tokenize import tokenize_source
from astrai_core.errors import DataError

from .conftest import chat


def _forbid_tokenizing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("tokenized although the cache should have been used")

    for name in ("render_chat", "render_text", "render_preference", "render_prompt"):
        monkeypatch.setattr(render, name, boom)


@pytest.mark.parametrize("fmt,rows", [
    ("text", [{"text": "1+2=3"}, {"text": "what is 4*5?"}]),
    ("chat", [chat("1+2=", "3"), chat("9-9=", "0")]),
    ("preference", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}]),
    ("prompt", [{"prompt": "1+1=", "answer": "2"}, {"messages": [{"role": "user", "content": "2+2="}],
                                                     "answer": "4"}]),
])
def test_second_run_hits_the_cache(write_jsonl, tmp_path, arith_tokenizer, monkeypatch, fmt, rows):
    path = write_jsonl(f"{fmt}.jsonl", rows)
    first = tokenize_source(path, fmt, arith_tokenizer, tmp_path / "cache")
    _forbid_tokenizing(monkeypatch)
    second = tokenize_source(path, fmt, arith_tokenizer, tmp_path / "cache")
    assert second.cache_entry == first.cache_entry and len(second) == len(rows)
    for name, ragged in first.fields.items():
        assert isinstance(second.fields[name].tokens, np.memmap)
        np.testing.assert_array_equal(second.fields[name].tokens, ragged.tokens)
        np.testing.assert_array_equal(second.fields[name].offsets, ragged.offsets)
    assert second.records == first.records
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.cache_entry.name]


def test_cached_tokens_match_direct_tokenization(write_jsonl, tmp_path, arith_tokenizer):
    path = write_jsonl("c.jsonl", [chat("12+35=", "47"), chat("3*4=", "12")])
    source = tokenize_source(path, "chat", arith_tokenizer, tmp_path / "cache")
    ragged = source.fields["input"]
    for i, (q, a) in enumerate((("12+35=", "47"), ("3*4=", "12"))):
        ids, mask = render.render_chat(arith_tokenizer, chat(q, a)["messages"])
        assert ragged.tokens_of(i).tolist() == ids and ragged.targets_of(i).tolist() == mask


def test_changed_file_or_template_is_tokenized_again(write_jsonl, tmp_path, chatml_dir):
    from astrai_core.data import load_tokenizer

    tokenizer = load_tokenizer(chatml_dir)
    path = write_jsonl("c.jsonl", [chat("hello", "there")])
    first = tokenize_source(path, "chat", tokenizer, tmp_path / "cache")
    write_jsonl("c.jsonl", [chat("hello", "there"), chat("how are", "you")])
    os.utime(path, ns=(1, 1))  # a different mtime as well as size
    second = tokenize_source(path, "chat", tokenizer, tmp_path / "cache")
    assert second.cache_entry != first.cache_entry and len(second) == 2
    tokenizer.chat_template = tokenizer.chat_template.replace("\n", " \n")
    third = tokenize_source(path, "chat", tokenizer, tmp_path / "cache")
    assert third.cache_entry not in (first.cache_entry, second.cache_entry)


def test_a_failed_run_leaves_no_entry(write_jsonl, tmp_path, arith_tokenizer):
    path = write_jsonl("t.jsonl", [{"text": "1"}] * 3000 + ['{"text": 1}'])
    with pytest.raises(DataError, match="line 3001"):
        tokenize_source(path, "text", arith_tokenizer, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_text_documents_end_with_eos(write_jsonl, tmp_path, arith_tokenizer):
    path = write_jsonl("t.jsonl", [{"text": "12+3"}])
    ragged = tokenize_source(path, "text", arith_tokenizer, tmp_path / "cache").fields["input"]
    assert arith_tokenizer.decode(ragged.tokens_of(0)) == "12+3<|end|>"
    assert ragged.targets is None  # every text token is a target: no mask stored
