"""A request body -> its pydantic model, with OpenAI-shaped 400s (runs off the event loop)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from astrai_core.serving.protocol import APIError

MAX_JSON_DEPTH = 64  # deeper bodies are refused (OpenAI's own shapes nest a few levels)


def parse_body(raw: bytes, content_type: str, model_cls: type[BaseModel]) -> Any:
    """``raw`` (the whole body) validated as ``model_cls``; every failure is an :class:`APIError`."""
    if content_type.split(";")[0].strip() != "application/json":
        raise APIError(400, "the body must be JSON (Content-Type: application/json)")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(400, f"malformed JSON body: {error}", code="invalid_json") from None
    except RecursionError:  # the parser's own guard, far deeper than MAX_JSON_DEPTH
        body = None
    if body is None or json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels",
                       code="invalid_json")
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as error:
        problem = error.errors()[0]
        param = ".".join(str(p) for p in problem["loc"]) or None
        message = problem["msg"].removeprefix("Value error, ")
        raise APIError(400, f"{param}: {message}" if param else message, param=param,
                       code="invalid_value") from None


def json_depth(value: Any) -> int:
    """How deep objects and arrays nest in ``value`` (iterative: no recursion to exhaust);
    the walk stops once it passes :data:`MAX_JSON_DEPTH`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest
