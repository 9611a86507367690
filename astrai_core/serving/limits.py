"""What one client may cost the server: body size, time to send, open connections.

:class:`ServeLimits` holds the limits (``astrai serve`` options). :class:`BodyLimit` is the
ASGI middleware that reads a request body before the application sees it, refusing it
(413) the moment it grows past ``max_body_bytes`` and (408) when the client stalls
longer than ``body_timeout`` between two pieces; nothing past the limit is ever held in
memory. The connection-level limits are enforced by the HTTP protocol in
:mod:`astrai_core.serving.connections`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from astrai_core.serving.protocol import APIError

MIB = 1 << 20
MAX_HEADER_BYTES = 64 * 1024  # request line and headers; larger is refused (431)


@dataclass(frozen=True)
class ServeLimits:
    """Per-request and per-connection bounds (seconds, bytes, counts)."""

    max_body_bytes: int = 4 * MIB
    body_timeout: float = 30.0        # longest wait for the next piece of a request body
    header_timeout: float = 10.0      # request line and headers must be in within this
    keep_alive_timeout: float = 5.0   # an idle keep-alive connection closes after this
    max_connections: int = 256        # more open connections are answered 503 and closed
    graceful_shutdown_timeout: float = 10.0  # on shutdown, running responses get this long

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("body_timeout", "header_timeout", "keep_alive_timeout", "graceful_shutdown_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: the whole body, at most ``max_bytes``, read before ``app`` runs.

    The application then receives it as one message; later ``receive`` calls (a handler
    waiting for the client to disconnect) go to the server as usual.
    """

    def __init__(self, app: Callable, max_bytes: int, timeout: float) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except APIError as error:
            await _answer(send, error)
            return
        if body is None:  # the client went away while sending
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope: dict[str, Any], receive: Receive) -> bytes | None:
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_large()  # refused before a byte of it is read
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except TimeoutError:
                raise APIError(408, f"the request body stalled for more than {self.timeout:g} s",
                               code="body_timeout") from None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than this server's limit of "
                        f"{self.max_bytes} bytes ({self.max_bytes / MIB:g} MiB, --max-body-mb)",
                        code="request_too_large")


async def _answer(send: Send, error: APIError) -> None:
    """An error response in OpenAI's shape, straight through ASGI (the app never ran)."""
    payload = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
