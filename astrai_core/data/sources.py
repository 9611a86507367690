"""JSONL readers with per-format row validation.

Every malformed row raises :class:`DataError` naming the file, the 1-based line number
and the problem. Rows come back normalized (see :func:`read_rows`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from astrai_core.data.images import parts_problem
from astrai_core.errors import DataError

FORMATS = ("text", "chat", "preference", "unpaired", "prompt", "prompt_completion")
ROLES = ("system", "user", "assistant", "tool")


class RowError(ValueError):
    """A row problem, before the file and line are attached."""


def require_file(path: Path, field: str) -> None:
    """Raise a DataError naming the config ``field`` when ``path`` is not a readable file."""
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "not found"
        raise DataError(f"{field}: data file {what}: {path}")


def read_rows(path: Path, fmt: str, field: str = "data") -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, normalized_row)`` for each non-blank line of a JSONL file.

    Normalized rows: text ``{"text"}``; chat ``{"messages"}``; preference
    ``{"prompt": str | None, "messages": list | None, "chosen", "rejected"}`` (and
    ``"margin"``, a float, when the row gives one) where chosen/rejected are strings or
    lists of assistant messages; unpaired ``{"prompt", "messages", "completion", "label":
    bool}`` (a completion marked desirable or not); prompt
    ``{"prompt": str | None, "messages": list | None, "columns": dict}``; prompt_completion
    ``{"prompt", "messages", "completion"}``. A ``prompt`` given as a list of messages
    (TRL's conversational shape) comes back as ``messages``. Chat, preference and
    unpaired rows keep an ``images`` list when they give one.
    """
    if fmt not in FORMATS:
        raise DataError(f"{field}: unknown data format {fmt!r}; expected one of {', '.join(FORMATS)}")
    require_file(path, field)
    validate = ROW_VALIDATORS[fmt]
    found = False
    with path.open("rb") as f:
        for line_number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield line_number, validate(_parse_object(raw))
            except RowError as err:
                raise DataError(f"data file {path}, line {line_number}: {err}") from None
            found = True
    if not found:
        raise DataError(f"{field}: data file has no rows: {path}")


def _parse_object(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RowError(f"not valid UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise RowError(f"invalid JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {_type_name(row)}")
    return row


def _type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean",
             int: "integer", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _string(row: dict, key: str, *, allow_empty: bool = False) -> str:
    if key not in row:
        raise RowError(f"missing field {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise RowError(f"field {key!r} must be a string, got {_type_name(value)}")
    if not allow_empty and not value:
        raise RowError(f"field {key!r} is empty")
    return value


def _messages(value: Any, key: str) -> list[dict]:
    """Validate a list of ``{"role", "content"}`` messages; return plain copies."""
    if not isinstance(value, list):
        raise RowError(f"field {key!r} must be an array of messages, got {_type_name(value)}")
    if not value:
        raise RowError(f"field {key!r} is empty")
    messages = []
    for i, message in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(message, dict):
            raise RowError(f"{where} must be an object with 'role' and 'content', "
                           f"got {_type_name(message)}")
        if "role" not in message:
            raise RowError(f"{where}: missing field 'role'")
        role = message["role"]
        if not isinstance(role, str):
            raise RowError(f"{where}: field 'role' must be a string, got {_type_name(role)}")
        if role not in ROLES:
            raise RowError(f"{where}: unknown role {role!r}; expected one of {', '.join(ROLES)}")
        if "content" not in message:
            raise RowError(f"{where}: missing field 'content'")
        problem = parts_problem(message["content"], where)
        if problem:  # a string, or text and image parts (data/images.py)
            raise RowError(problem)
        messages.append(dict(message))
    return messages


def _validate_text(row: dict) -> dict:
    return {"text": _string(row, "text")}


def _validate_chat(row: dict) -> dict:
    if "messages" not in row:
        raise RowError("missing field 'messages'")
    messages = _messages(row["messages"], "messages")
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("'messages' has no assistant message, so nothing to learn")
    return {"messages": messages, **_images(row)}


def _images(row: dict) -> dict:
    """``{"images": [...]}`` when the row gives an ``images`` list (the sources of its
    ``{"type": "image"}`` parts without one of their own), else ``{}``."""
    images = row.get("images")
    if images is not None and not isinstance(images, list):
        raise RowError(f"field 'images' must be a list of images, got {_type_name(images)}")
    return {"images": images} if images else {}


def _prompt_side(row: dict) -> tuple[str | None, list[dict] | None]:
    """The prompt of a preference/unpaired/prompt row: exactly one of 'prompt' (a string, or
    a list of messages as TRL's conversational datasets give it) and 'messages'."""
    has_prompt, has_messages = "prompt" in row, "messages" in row
    if has_prompt == has_messages:
        raise RowError("needs exactly one of 'prompt' (a string or a list of messages) and "
                       "'messages' (a chat prefix)" + (", got both" if has_prompt else ""))
    if has_prompt and not isinstance(row["prompt"], list):
        return _string(row, "prompt"), None
    key = "prompt" if has_prompt else "messages"
    messages = _messages(row[key], key)
    if messages[-1]["role"] == "assistant":
        raise RowError("the last message of a prompt must not be an assistant message")
    return None, messages


def _response(row: dict, key: str) -> str | list[dict]:
    """A preference or unpaired response: a string, an assistant message, or a list of
    them."""
    if key not in row:
        raise RowError(f"missing field {key!r}")
    value = row[key]
    if isinstance(value, str):
        if not value:
            raise RowError(f"field {key!r} is empty")
        return value
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise RowError(f"field {key!r} must be a string or assistant messages, got {_type_name(value)}")
    messages = _messages(value, key)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            raise RowError(f"{key}[{i}]: role must be 'assistant', got {message['role']!r}")
    return messages


def _margin(row: dict) -> float | None:
    """A preference row's optional ``margin``: how much more the chosen response is preferred
    (a reward model's loss asks for at least this reward gap)."""
    value = row.get("margin")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RowError(f"field 'margin' must be a finite number, got {value!r}")
    return float(value)


def _validate_preference(row: dict) -> dict:
    if "prompt" not in row and "messages" not in row:
        row = implicit_prompt(row)
    prompt, messages = _prompt_side(row)
    pair = {"prompt": prompt, "messages": messages, "chosen": _response(row, "chosen"),
            "rejected": _response(row, "rejected"), **_images(row)}
    margin = _margin(row)
    return pair if margin is None else {**pair, "margin": margin}


def implicit_prompt(row: dict) -> dict:
    """``row`` with its prompt taken out of ``chosen`` and ``rejected`` (TRL's implicit
    prompt): the messages both conversations start with, or for two strings the text both
    start with (a space just before the first difference stays with the responses)."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if chosen is None or rejected is None:
        raise RowError("needs 'chosen' and 'rejected', and 'prompt' unless the prompt is the "
                       "start both share")
    if isinstance(chosen, str) != isinstance(rejected, str) or not isinstance(chosen, (str, list)):
        raise RowError("without 'prompt', 'chosen' and 'rejected' must both be strings or both "
                       "whole conversations (lists of messages)")
    shared = 0
    while (shared < min(len(chosen), len(rejected))
           and chosen[shared] == rejected[shared]):
        shared += 1
    if isinstance(chosen, str) and 0 < shared < min(len(chosen), len(rejected)) \
            and chosen[shared - 1] == " ":
        shared -= 1
    if shared == 0:
        raise RowError("without 'prompt', 'chosen' and 'rejected' must start with the same "
                       "prompt, and they share nothing")
    if shared in (len(chosen), len(rejected)):
        raise RowError("without 'prompt', 'chosen' and 'rejected' must differ after the "
                       "prompt they share, and one is the start of the other")
    rest = {k: v for k, v in row.items() if k not in ("chosen", "rejected")}
    return {**rest, "prompt": chosen[:shared], "chosen": chosen[shared:],
            "rejected": rejected[shared:]}


def _validate_unpaired(row: dict) -> dict:
    prompt, messages = _prompt_side(row)
    if "label" not in row:
        raise RowError("missing field 'label' (true: a desirable completion, false: not)")
    if not isinstance(row["label"], bool):
        raise RowError(f"field 'label' must be true or false, got {_type_name(row['label'])}")
    return {"prompt": prompt, "messages": messages,
            "completion": _response(row, "completion"), "label": row["label"], **_images(row)}


def _validate_prompt(row: dict) -> dict:
    prompt, messages = _prompt_side(row)
    columns = {k: v for k, v in row.items() if k not in ("prompt", "messages")}
    return {"prompt": prompt, "messages": messages, "columns": columns}


def _validate_prompt_completion(row: dict) -> dict:
    prompt, messages = _prompt_side(row)
    return {"prompt": prompt, "messages": messages, "completion": _response(row, "completion")}


# Each format's row check, shared by the JSONL reader and the other sources (datasets_io).
ROW_VALIDATORS = {"text": _validate_text, "chat": _validate_chat,
               "preference": _validate_preference, "unpaired": _validate_unpaired,
               "prompt": _validate_prompt, "prompt_completion": _validate_prompt_completion}
