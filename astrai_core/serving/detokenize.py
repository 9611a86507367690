"""Incremental detokenization and stop-string holdback, shared by streaming and non-streaming.

The server builds one :class:`IncrementalDetokenizer` and one :class:`StopStringHoldback`
per completion and concatenates their outputs for a non-streamed answer, so the joined
stream deltas always equal the non-streamed content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns token ids into text deltas; never emits part of a multi-byte character.

    Each delta is the text that a short window of recent tokens adds (decoding the window
    with and without the new tokens), so that tokenizers whose decoding depends on
    neighbours (leading spaces, byte-level pieces) give the same text as a full decode.
    While the window's text ends in U+FFFD a character is still incomplete: nothing is
    emitted until its last byte arrives (or :meth:`finish`).
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens: list[int] = []
        self._prefix_offset = 0  # the window starts here ...
        self._read_offset = 0    # ... and its text up to here has been emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        self.tokens.append(int(token_id))
        return self._advance(final=False)

    def finish(self) -> str:
        """Whatever is still held (an incomplete character decodes to U+FFFD here)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        emitted = self._decode(self.tokens[self._prefix_offset:self._read_offset])
        window = self._decode(self.tokens[self._prefix_offset:])
        if len(window) <= len(emitted) or (window.endswith(_REPLACEMENT) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.tokens)
        return window[len(emitted):]


class StopStringHoldback:
    """Cuts the text at the first stop string and holds back a suffix that could start one.

    ``push(delta)`` returns ``(text safe to emit, stopped)``; after a stop nothing more is
    emitted. The stop string itself is never part of the output.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return delta, False
        text = self._held + delta
        found = [at for at in (text.find(stop) for stop in self.stops) if at >= 0]
        if found:
            self._held, self.stopped = "", True
            return text[:min(found)], True
        keep = max((prefix_overlap(text, stop) for stop in self.stops), default=0)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], False

    def finish(self) -> str:
        """The held suffix: the text ended without completing a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def prefix_overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0
