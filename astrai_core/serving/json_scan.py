"""An incremental JSON syntax checker, fed one character at a time.

The Hermes tool-call parser runs it over the body of a ``<tool_call>`` so that it knows,
at every character, whether it is inside a string (a ``</tool_call>`` there is data, not
the end of the call), where each member of the top-level object starts and ends, and
whether the text so far can be closed by appending closers only (a "safe point": what
streams to the client is always cut at one, so every streamed prefix is partial JSON that
a closing quote and brackets complete).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
WHITESPACE = frozenset(" \t\n\r")


class JsonSyntaxError(ValueError):
    """The text stopped being a prefix of valid JSON."""


class JsonScanner:
    """Checks one JSON value, character by character.

    ``push(c)`` returns the structural events that character caused, in order:
    ``("key", text)`` when an object key is complete, ``("value_start", depth)`` when a
    value begins inside ``depth`` open containers, and ``("value_end", depth, inclusive)``
    when it ends (``inclusive``: the current character is its last one; numbers and
    literals end on the character after them). Raises :class:`JsonSyntaxError`.
    """

    def __init__(self) -> None:
        self.stack: list[str] = []      # open containers, "{" or "["
        self.expect = "value"           # value | key_or_end | key | colon | comma_or_end | value_or_end | done
        self.scalar: str | None = None  # string | key | number | literal while one is being read
        self.text = ""                  # the key, number or literal read so far
        self.escape = 0                 # 0, -1 after a backslash, or hex digits still due after \u

    @property
    def done(self) -> bool:
        return self.expect == "done"

    def closable(self) -> bool:
        """True when appending :meth:`closers` makes the text so far valid JSON."""
        if self.scalar == "string":
            return self.escape == 0
        return self.scalar is None and self.expect in ("comma_or_end", "key_or_end", "value_or_end", "done")

    def closers(self, keep_depth: int = 0) -> str:
        """What closes the open string and the containers deeper than ``keep_depth``."""
        quote = '"' if self.scalar == "string" else ""
        return quote + "".join("}" if c == "{" else "]" for c in reversed(self.stack[keep_depth:]))

    def push(self, c: str) -> list[tuple]:
        events: list[tuple] = []
        if self.scalar in ("string", "key"):
            self._string_char(c, events)
            return events
        if self.scalar in ("number", "literal"):
            if self._scalar_continues(c):
                return events
            self._end_value(events, inclusive=False)
        self._structural(c, events)
        return events

    # ---------------------------------------------------------------- strings
    def _string_char(self, c: str, events: list[tuple]) -> None:
        if self.escape == -1:
            if c not in _ESCAPES:
                raise JsonSyntaxError(f"invalid escape \\{c}")
            self.escape = 4 if c == "u" else 0
        elif self.escape > 0:
            if c not in _HEX:
                raise JsonSyntaxError(f"invalid \\u escape digit {c!r}")
            self.escape -= 1
        elif c == "\\":
            self.escape = -1
        elif c == '"':
            if self.scalar == "key":
                import json

                events.append(("key", json.loads(self.text + '"')))
                self.scalar, self.expect = None, "colon"
                return
            self._end_value(events, inclusive=True)
            return
        elif ord(c) < 0x20:
            raise JsonSyntaxError("control character in a string")
        if self.scalar == "key":
            self.text += c

    # ---------------------------------------------------------------- numbers, literals
    def _scalar_continues(self, c: str) -> bool:
        if self.scalar == "number":
            if c in _NUMBER_CHARS:
                self.text += c
                return True
            if not _NUMBER.fullmatch(self.text):
                raise JsonSyntaxError(f"invalid number {self.text!r}")
            return False
        word = _LITERALS[self.text[0]]
        if len(self.text) < len(word):
            if c != word[len(self.text)]:
                raise JsonSyntaxError(f"invalid literal {self.text + c!r}")
            self.text += c
            return True
        return False

    # ---------------------------------------------------------------- structure
    def _structural(self, c: str, events: list[tuple]) -> None:
        if c in WHITESPACE:
            return
        expect = self.expect
        if expect in ("value", "value_or_end"):
            if c == "]" and expect == "value_or_end":
                self._close(c, events)
            else:
                self._start_value(c, events)
        elif expect in ("key", "key_or_end"):
            if c == '"':
                self.scalar, self.text, self.escape = "key", '"', 0
            elif c == "}" and expect == "key_or_end":
                self._close(c, events)
            else:
                raise JsonSyntaxError(f"expected a key, got {c!r}")
        elif expect == "colon":
            if c != ":":
                raise JsonSyntaxError(f"expected ':', got {c!r}")
            self.expect = "value"
        elif expect == "comma_or_end":
            if c == ",":
                self.expect = "key" if self.stack[-1] == "{" else "value"
            elif c in "}]":
                self._close(c, events)
            else:
                raise JsonSyntaxError(f"expected ',' or a closing bracket, got {c!r}")
        else:  # done
            raise JsonSyntaxError(f"text after the end of the value: {c!r}")

    def _start_value(self, c: str, events: list[tuple]) -> None:
        events.append(("value_start", len(self.stack)))
        if c in "{[":
            self.stack.append(c)
            self.expect = "key_or_end" if c == "{" else "value_or_end"
        elif c == '"':
            self.scalar, self.escape = "string", 0
        elif c == "-" or c.isdigit():
            self.scalar, self.text = "number", c
        elif c in _LITERALS:
            self.scalar, self.text = "literal", c
        else:
            raise JsonSyntaxError(f"expected a value, got {c!r}")

    def _close(self, c: str, events: list[tuple]) -> None:
        if (self.stack[-1] == "{") != (c == "}"):
            raise JsonSyntaxError(f"mismatched {c!r}")
        self.stack.pop()
        self._end_value(events, inclusive=True)

    def _end_value(self, events: list[tuple], inclusive: bool) -> None:
        if self.scalar == "literal" and self.text != _LITERALS[self.text[0]]:
            raise JsonSyntaxError(f"invalid literal {self.text!r}")
        self.scalar, self.text = None, ""
        events.append(("value_end", len(self.stack), inclusive))
        self.expect = "comma_or_end" if self.stack else "done"
