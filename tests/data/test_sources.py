"""Row parsing per format and the errors for malformed rows and missing files."""

from __future__ import annotations

import json

import pytest

from astrai_core.data import DataConfig, build_train_loader
from astrai_core.data.sources import read_rows
from astrai_core.errors import DataError

USER = {"role": "user", "content": "2+2="}
ASSISTANT = {"role": "assistant", "content": "4"}


def rows_of(path, fmt):
    return list(read_rows(path, fmt))


def test_text_rows_and_blank_lines_keep_line_numbers(write_jsonl):
    path = write_jsonl("t.jsonl", [{"text": "abc"}, "", {"text": "d", "extra": 1}])
    assert rows_of(path, "text") == [(1, {"text": "abc"}), (3, {"text": "d"})]


def test_chat_rows(write_jsonl):
    path = write_jsonl("c.jsonl", [{"messages": [USER, ASSISTANT]}])
    assert rows_of(path, "chat") == [(1, {"messages": [USER, ASSISTANT]})]


def test_preference_rows_string_and_message_forms(write_jsonl):
    path = write_jsonl("p.jsonl", [
        {"prompt": "q", "chosen": "a", "rejected": "b"},
        {"messages": [USER], "chosen": ASSISTANT, "rejected": [ASSISTANT]},
    ])
    (_, plain), (_, conv) = rows_of(path, "preference")
    assert plain == {"prompt": "q", "messages": None, "chosen": "a", "rejected": "b"}
    assert conv == {"prompt": None, "messages": [USER], "chosen": [ASSISTANT],
                    "rejected": [ASSISTANT]}


def test_unpaired_rows_string_and_message_forms(write_jsonl):
    path = write_jsonl("u.jsonl", [
        {"prompt": "q", "completion": "a", "label": True},
        {"messages": [USER], "completion": ASSISTANT, "label": False},
    ])
    (_, plain), (_, conv) = rows_of(path, "unpaired")
    assert plain == {"prompt": "q", "messages": None, "completion": "a", "label": True}
    assert conv == {"prompt": None, "messages": [USER], "completion": [ASSISTANT],
                    "label": False}


def test_prompt_rows_keep_other_columns_verbatim(write_jsonl):
    columns = {"answer": "4", "meta": {"level": [1, 2]}, "score": 0.5}
    path = write_jsonl("r.jsonl", [{"messages": [USER], **columns}, {"prompt": "x", "id": 7}])
    (_, first), (_, second) = rows_of(path, "prompt")
    assert first == {"prompt": None, "messages": [USER], "columns": columns}
    assert second == {"prompt": "x", "messages": None, "columns": {"id": 7}}


MALFORMED = [
    ("text", '{"text": "ok"', "invalid JSON"),
    ("text", '["text"]', "expected a JSON object, got array"),
    ("text", '{"txt": "a"}', "missing field 'text'"),
    ("text", '{"text": 5}', "field 'text' must be a string, got integer"),
    ("text", '{"text": ""}', "field 'text' is empty"),
    ("chat", '{"messages": []}', "field 'messages' is empty"),
    ("chat", '{"messages": "hi"}', "must be an array of messages, got string"),
    ("chat", '{"messages": [{"role": "robot", "content": "x"}]}', "unknown role 'robot'"),
    ("chat", '{"messages": [{"content": "x"}]}', "messages[0]: missing field 'role'"),
    ("chat", '{"messages": [{"role": "user"}]}', "messages[0]: missing field 'content'"),
    ("chat", '{"messages": [{"role": "user", "content": 3}]}', "'content' must be a string"),
    ("chat", '{"messages": [{"role": "user", "content": "x"}]}', "no assistant message"),
    ("preference", '{"prompt": "q", "chosen": "a"}', "missing field 'rejected'"),
    ("preference", '{"prompt": "q", "messages": [], "chosen": "a", "rejected": "b"}',
     "exactly one of 'prompt'"),
    ("preference", '{"prompt": "q", "chosen": [{"role": "user", "content": "a"}], '
                   '"rejected": "b"}', "chosen[0]: role must be 'assistant'"),
    ("unpaired", '{"prompt": "q", "completion": "a"}', "missing field 'label'"),
    ("unpaired", '{"prompt": "q", "completion": "a", "label": 1}',
     "field 'label' must be true or false, got integer"),
    ("unpaired", '{"prompt": "q", "label": true}', "missing field 'completion'"),
    ("unpaired", '{"completion": "a", "label": true}', "exactly one of 'prompt'"),
    ("prompt", '{"answer": "4"}', "exactly one of 'prompt'"),
    ("prompt", json.dumps({"messages": [USER, ASSISTANT]}), "must not be an assistant message"),
]


@pytest.mark.parametrize("fmt,line,problem", MALFORMED)
def test_malformed_row_names_file_line_and_problem(write_jsonl, fmt, line, problem):
    good = {"text": "fine"} if fmt == "text" else {"messages": [USER, ASSISTANT]}
    if fmt == "preference":
        good = {"prompt": "q", "chosen": "a", "rejected": "b"}
    elif fmt == "unpaired":
        good = {"prompt": "q", "completion": "a", "label": False}
    elif fmt == "prompt":
        good = {"prompt": "q"}
    path = write_jsonl("bad.jsonl", [good, "", line])
    with pytest.raises(DataError) as err:
        rows_of(path, fmt)
    message = str(err.value)
    assert str(path) in message and "line 3" in message and problem in message


def test_invalid_utf8_is_a_row_error(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"line 2: not valid UTF-8"):
        rows_of(path, "text")


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError, match="has no rows"):
        rows_of(path, "text")


def test_missing_file_names_the_config_field(tmp_path, arith_tokenizer):
    cfg = DataConfig(sources=[{"path": "ok.jsonl", "format": "text"},
                              {"path": "nope.jsonl", "format": "text"}],
                     cache_dir=tmp_path / "cache")
    (tmp_path / "ok.jsonl").write_text('{"text": "1+1"}\n')
    with pytest.raises(DataError) as err:
        build_train_loader(cfg, arith_tokenizer, base_dir=tmp_path)
    assert "data.sources[1].path" in str(err.value) and str(tmp_path / "nope.jsonl") in str(err.value)


def test_malformed_row_stops_the_loader_build(write_jsonl, tmp_path, arith_tokenizer):
    path = write_jsonl("chat.jsonl", [{"messages": [USER, ASSISTANT]},
                                      {"messages": [USER, {"role": "bot", "content": "4"}]}])
    cfg = DataConfig(sources=[{"path": str(path), "format": "chat"}], cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"chat.jsonl, line 2: messages\[1\]: unknown role 'bot'"):
        build_train_loader(cfg, arith_tokenizer)
    assert not any((tmp_path / "cache").iterdir())  # nothing half-written left behind
