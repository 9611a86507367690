"""The HTTP server under the app: uvicorn with a header deadline and a connection cap.

uvicorn (0.3x-0.5x) has no timeout for a request's headers: a connection that opens and
then sends its request line byte by byte, or nothing at all, is held forever, and enough
of them exhaust the process's file handles. Its ``limit_concurrency`` only answers 503
once a request's headers are in, so it does not bound such connections either.
:func:`guarded_protocol` subclasses uvicorn's own HTTP protocol (httptools when
installed, else h11) and adds, per connection:

- a header deadline: the request line and headers must be complete within
  ``header_timeout`` seconds of the connection opening or of the previous response
  ending, else the connection is answered 408 and closed (this also bounds how long the
  server keeps discarding the rest of a body it already refused);
- a header size cap (:data:`~astrai_core.serving.limits.MAX_HEADER_BYTES`): 431 and close
  (with h11, its own ``max_incomplete_event_size`` at the same size answers 400);
- a connection cap: a connection beyond ``max_connections`` is answered 503 and closed at
  once, before anything of it is read.

Idle keep-alive connections close after ``keep_alive_timeout`` (uvicorn's own timer).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from astrai_core.serving.limits import MAX_HEADER_BYTES, ServeLimits
from astrai_core.serving.protocol import APIError


def _raw_response(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection (OpenAI's error shape)."""
    body = json.dumps(APIError(status, message).body()).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n")
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


class _Guard:
    """Mixed in before uvicorn's HTTP protocol class; ``limits`` is set by :func:`guarded_protocol`."""

    limits: ServeLimits

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes: int | None = None  # counting while a request's headers arrive (httptools)
        self._seen_cycle = None
        if len(self.connections) >= self.limits.max_connections:
            self.transport = transport  # connection_lost closes it again, harmlessly
            transport.write(_raw_response(503, "Service Unavailable",
                                          f"the server holds {self.limits.max_connections} connections "
                                          f"already (--max-connections); retry later"))
            transport.close()
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._seen_cycle:  # a request's headers are complete
            self._seen_cycle = self.cycle
            self._disarm()
        if self._header_bytes is not None and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers exceed {MAX_HEADER_BYTES} bytes")

    # httptools only: the span in which a request's headers arrive
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._header_bytes = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:  # nothing pipelined: wait for headers
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.limits.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        self._refuse(408, "Request Timeout",
                     f"the request headers did not arrive within {self.limits.header_timeout:g} s")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # no response of ours is half-sent
            self.transport.write(_raw_response(status, reason, message))
        self.transport.close()


def guarded_protocol(limits: ServeLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with :class:`_Guard`'s limits."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # httptools is optional for uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type(f"Guarded{base.__name__}", (_Guard, base), {"limits": limits})


def server_config(app: Any, limits: ServeLimits, **kwargs: Any):
    """A ``uvicorn.Config`` for ``app`` with ``limits`` (``kwargs``: host, port, log_level, ...)."""
    import uvicorn

    return uvicorn.Config(app, http=guarded_protocol(limits), timeout_keep_alive=limits.keep_alive_timeout,
                          timeout_graceful_shutdown=limits.graceful_shutdown_timeout,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, **kwargs)

