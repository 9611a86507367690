"""Results of queued requests, held until the SDK polls for them.

A request's future is created on the event loop when it is accepted; the engine's worker
thread fills it in. ``retrieve_future`` waits a while for a pending one (a long poll), then
answers ``try_again``; sampling sessions also get a completion feed for ``retrieve_futures``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

PROTO = "application/x-protobuf"
JSON = "application/json"
KEEP_DONE = 20_000  # finished results kept for polling; the oldest go first
KEEP_SERVED_S = 60.0  # a result already read stays this long, for a client whose read broke off


@dataclass
class Payload:
    media_type: str
    body: bytes
    failed: bool = False


@dataclass
class _Entry:
    event: asyncio.Event
    feed: tuple[str, int] | None
    payload: Payload | None = None


@dataclass
class _Feed:
    events: list[tuple[int, str, bool, int]] = field(default_factory=list)  # cursor, id, ok, size
    changed: asyncio.Event = field(default_factory=asyncio.Event)


def failure(message: str, category: str = "user") -> Payload:
    return Payload(JSON, json.dumps({"error": message, "category": category}).encode(), failed=True)


def json_payload(obj: dict) -> Payload:
    return Payload(JSON, json.dumps(obj).encode())


class FutureStore:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._feeds: dict[tuple[str, int], _Feed] = {}
        self._ids = itertools.count()
        self._cursor = itertools.count(1)
        self._served: deque[tuple[float, str]] = deque()  # (when read, request id)

    def create(self, feed: tuple[str, int] | None = None) -> str:
        """A new pending future (call on the event loop); ``feed``: a sampling session's."""
        request_id = f"req-{next(self._ids)}"
        with self._lock:
            self._forget_served()
            self._entries[request_id] = _Entry(asyncio.Event(), feed)
            if feed is not None and feed not in self._feeds:
                self._feeds[feed] = _Feed()
        return request_id

    def resolve(self, request_id: str, payload: Payload) -> None:
        """Fill a future in; safe from any thread."""
        self._loop.call_soon_threadsafe(self._settle, request_id, payload)

    def _settle(self, request_id: str, payload: Payload) -> None:
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.payload is not None:
                return
            entry.payload = payload
            self._entries.move_to_end(request_id)
            while len(self._entries) > KEEP_DONE and next(iter(self._entries.values())).payload is not None:
                self._entries.popitem(last=False)
        entry.event.set()
        if entry.feed is not None:
            feed = self._feeds[entry.feed]
            feed.events.append((next(self._cursor), request_id, not payload.failed, len(payload.body)))
            feed.changed.set()

    async def wait(self, request_id: str, timeout: float) -> Payload | None:
        """The result, or None if still pending after ``timeout``; KeyError if unknown."""
        entry = self._entries[request_id]
        if entry.payload is None:
            try:
                await asyncio.wait_for(entry.event.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        if entry.payload is not None:
            self._served.append((time.monotonic(), request_id))
        return entry.payload

    def _forget_served(self) -> None:
        cutoff = time.monotonic() - KEEP_SERVED_S
        while self._served and self._served[0][0] < cutoff:
            self._entries.pop(self._served.popleft()[1], None)

    async def completions(self, feed_key: tuple[str, int], prev_cursor: int,
                          timeout: float) -> tuple[list[dict], int]:
        """Completions after ``prev_cursor`` on one sampling session's feed (a long poll)."""
        feed = self._feeds.setdefault(feed_key, _Feed())
        feed.events = [e for e in feed.events if e[0] > prev_cursor]  # seen ones are dropped
        if not feed.events and timeout > 0:
            feed.changed.clear()
            try:
                await asyncio.wait_for(feed.changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        items = [{"state": "finished", "request_id": rid, "response_payload_uncompressed_size": size}
                 if ok else {"state": "failed", "request_id": rid} for _, rid, ok, size in feed.events]
        cursor = feed.events[-1][0] if feed.events else prev_cursor
        return items, cursor
