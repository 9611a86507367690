"""Chat messages and tools checked against the shapes OpenAI's API allows.

A message that the chat template could still render but that OpenAI would refuse
(``content: 5``, a tool message without ``tool_call_id``, a tool whose ``parameters`` is
not a JSON Schema) is a 400 naming the field, so a client learns of its mistake here
rather than from a model that was shown something else. Text and image (``image_url``)
content parts are served; audio and file parts are refused by name. Whether the model
takes images, and whether each image is a readable data: URL, is checked later
(:mod:`astrai_core.serving.images`).
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
# The content-part types each role may send (OpenAI's chat completions API).
_PART_TYPES = {"system": ("text",), "developer": ("text",), "tool": ("text",),
               "user": ("text", "image_url", "input_audio", "file"), "assistant": ("text", "refusal")}
_SERVED_PART_TYPES = ("text", "refusal", "image_url")


def check_message(index: int, message: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming ``messages[index]``'s first field that OpenAI would refuse."""
    where = f"messages[{index}]"
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}.role must be system, developer, user, assistant or tool, got {role!r}")
    content = message.get("content")
    has_calls = bool(message.get("tool_calls")) or message.get("function_call") is not None
    if content is None:
        if role != "assistant" or not has_calls:
            raise ValueError(f"{where}.content is required for a {role} message"
                             + (" without tool_calls" if role == "assistant" else ""))
    elif isinstance(content, list):
        for j, part in enumerate(content):
            _check_part(f"{where}.content[{j}]", role, part)
    elif not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string or a list of content parts, "
                         f"got {type(content).__name__}")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise ValueError(f"{where}.tool_call_id (a string) is required for a tool message")
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise ValueError(f"{where}.tool_calls is only allowed on assistant messages")
        _check_tool_calls(f"{where}.tool_calls", message["tool_calls"])
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{where}.name must be a string")


def _check_part(where: str, role: str, part: Any) -> None:
    if not isinstance(part, dict):
        raise ValueError(f"{where} must be an object with a type, got {type(part).__name__}")
    kind = part.get("type")
    if kind not in _PART_TYPES[role]:
        raise ValueError(f"{where}.type must be one of {list(_PART_TYPES[role])} for a {role} "
                         f"message, got {kind!r}")
    if kind not in _SERVED_PART_TYPES:
        raise ValueError(f"{where}: content parts of type {kind!r} are not supported by this "
                         f"text-only server")
    if kind == "image_url":
        value = part.get(kind)
        if not isinstance(value, dict) or not isinstance(value.get("url"), str):
            raise ValueError(f"{where}.image_url must be an object with a url string")
    elif not isinstance(part.get(kind), str):
        raise ValueError(f"{where}.{kind} must be a string")


def _check_tool_calls(where: str, calls: Any) -> None:
    if not isinstance(calls, list):
        raise ValueError(f"{where} must be a list")
    for j, call in enumerate(calls):
        here = f"{where}[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise ValueError(f"{here} must be an object of type 'function'")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"{here}.function.name (a string) is required")
        if not isinstance(function.get("arguments"), str | dict):
            raise ValueError(f"{here}.function.arguments must be a JSON string")


def check_parameters_schema(schema: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``schema`` is a valid JSON Schema (its own ``$schema``
    dialect, else draft 2020-12, checked with ``jsonschema``)."""
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
    except SchemaError as error:
        path = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in error.path)
        raise ValueError(f"is not a valid JSON Schema: {error.message}"
                         + (f" (at parameters{path})" if path else "")) from None
