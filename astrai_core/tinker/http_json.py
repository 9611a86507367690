"""JSON bodies in and the SDK's error shape out, shared by the Tinker routes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from astrai_core.tinker.engine_types import EngineRequestError


def error(status: int, message: str, category: str = "user", headers: dict | None = None) -> JSONResponse:
    """The SDK's ``RequestFailedResponse`` shape, ``{"error", "category"}``, with ``status``."""
    return JSONResponse({"error": message, "category": category}, status_code=status, headers=headers)


async def read_body(request: Request) -> bytes:
    """The body, refused (413) as soon as it passes the app's ``max_body_bytes``: a body
    sent in chunks, without a Content-Length, is counted while it arrives."""
    limit = request.app.state.max_body_bytes
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise EngineRequestError(f"request body is over the server's limit of {limit} bytes", status=413)
        parts.append(part)
    return b"".join(parts)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object (never anything that runs code); a 400 otherwise."""
    try:
        body = json.loads(await read_body(request) or b"{}")
    except ValueError as exc:
        raise EngineRequestError(f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise EngineRequestError("request body must be a JSON object")
    return body
