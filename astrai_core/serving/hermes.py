"""The Hermes tool-call format, parsed incrementally: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

:class:`HermesParser` is a state machine fed text deltas; it never re-parses what it has
seen. ``feed(delta)`` and ``finish()`` return events::

    ContentDelta(text)               ordinary assistant text
    ToolCallStart(index, name)       a call is announced (indexes 0, 1, 2, ... in order)
    ToolCallArguments(index, text)   the next piece of that call's arguments JSON
    ToolCallEnd(index)               the call's arguments are complete

:func:`parse_hermes` is the non-streaming parse: the same machine fed the whole text, so
streaming and non-streaming always agree. Behaviour, character by character:

- Text outside calls is content and is emitted at once, except a suffix that could be the
  start of ``<tool_call>``: it is held, and emitted as content if the tag never completes
  (also when the text ends: ``The tag is <tool_`` keeps its ``<tool_``).
- Inside a call an incremental JSON checker tracks strings, so ``</tool_call>`` inside a
  string value is data. The call is announced when its ``"name"`` string is complete;
  the ``"arguments"`` object streams as the raw text the model wrote, cut at points
  where closing quotes/brackets would complete it. When the arguments come before the
  name they are held and sent right after the announcement. Other keys are ignored; a
  call with no ``"arguments"`` gets ``{}``.
- Invalid calls (the documented rule, the same streaming and not): if the body stops
  being valid JSON, or ends, before the call was announced (or the object closes with
  no string ``name``, or ``arguments`` is not an object), the whole block, ``<tool_call>``
  included, is content and parsing resumes at the offending character. If it breaks after
  the announcement, the arguments are closed at the last safe point (so they are still
  valid JSON), the call ends, and the rest of the block up to ``</tool_call>`` is dropped.
- After a call's object closes, whitespace and ``</tool_call>`` are consumed; any other
  text resumes content (the closing tag is optional).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from astrai_core.serving.detokenize import prefix_overlap
from astrai_core.serving.json_scan import WHITESPACE, JsonScanner, JsonSyntaxError

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"
_SPACES = "".join(sorted(WHITESPACE))


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int


Event = ContentDelta | ToolCallStart | ToolCallArguments | ToolCallEnd


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass
class ParsedMessage:
    content: str
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


class _Call:
    """The call being read: its raw block, JSON checker and what has been emitted."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.raw = ""                   # everything after <tool_call>
        self.scanner = JsonScanner()
        self.key: str | None = None     # the top-level member being read
        self.value_start = 0            # where that member's value starts in raw
        self.seen: set[str] = set()
        self.name: str | None = None
        self.announced = False
        self.args = ""                  # raw arguments text so far
        self.args_safe = 0              # longest prefix of args that closers complete
        self.args_sent = 0
        self.args_open = False
        self.args_done = False


class HermesParser:
    """Incremental Hermes tool-call parser; see the module docstring."""

    def __init__(self) -> None:
        self._mode = "text"             # text | call | after_call | discard
        self._held = ""                 # a possible tag prefix (or whitespace after a call)
        self._call: _Call | None = None
        self._calls = 0
        self._out: list[Event] = []

    # ---------------------------------------------------------------- public
    def feed(self, text: str) -> list[Event]:
        for c in text:
            self._push(c)
        return self._take()

    def finish(self) -> list[Event]:
        if self._mode == "text":
            self._content(self._held)
        elif self._mode == "call":
            self._end_of_call_text()
        self._held, self._mode = "", "text"
        return self._take()

    # ---------------------------------------------------------------- dispatch
    def _take(self) -> list[Event]:
        events, self._out = _coalesce(self._out), []
        return events

    def _content(self, text: str) -> None:
        if text:
            self._out.append(ContentDelta(text))

    def _push(self, c: str) -> None:
        if self._mode == "text":
            self._text_char(c)
        elif self._mode == "call":
            self._call_char(c)
        elif self._mode == "after_call":
            self._after_call_char(c)
        else:
            self._discard_char(c)

    def _text_char(self, c: str) -> None:
        held = self._held + c
        if held == START_TAG:
            self._held, self._mode = "", "call"
            self._call = _Call(self._calls)
            return
        keep = prefix_overlap(held, START_TAG) if not START_TAG.startswith(held) else len(held)
        self._content(held[:len(held) - keep])
        self._held = held[len(held) - keep:]

    def _after_call_char(self, c: str) -> None:
        held = self._held + c
        stripped = held.lstrip(_SPACES)
        if stripped == END_TAG:
            self._held, self._mode = "", "text"
        elif END_TAG.startswith(stripped):
            self._held = held
        else:  # no closing tag: the text (whitespace included) resumes as content
            self._held, self._mode = "", "text"
            for ch in held:
                self._text_char(ch)

    def _discard_char(self, c: str) -> None:
        held = self._held + c
        if held.endswith(END_TAG):
            self._held, self._mode = "", "text"
        else:
            self._held = held[-(len(END_TAG) - 1):]

    # ---------------------------------------------------------------- inside a call
    def _call_char(self, c: str) -> None:
        call = self._call
        at = len(call.raw)
        call.raw += c
        try:
            if not call.scanner.stack and not call.scanner.done and c not in WHITESPACE and c != "{":
                raise JsonSyntaxError("a tool call body must be a JSON object")
            for event in call.scanner.push(c):
                if call.args_open and event[0] == "value_end" and not event[2]:
                    call.args_safe = len(call.args)  # a number or literal just ended: safe before c
                self._member_event(call, event, at)
            if call.args_open:
                call.args += c
                if call.scanner.closable():
                    call.args_safe = len(call.args)
            self._send_args(call)
        except JsonSyntaxError:
            self._broken_call(c)
            return
        if call.scanner.done:
            self._close_call()

    def _member_event(self, call: _Call, event: tuple, at: int) -> None:
        kind = event[0]
        if kind == "key" and len(call.scanner.stack) == 1:
            if event[1] in call.seen and event[1] in ("name", "arguments"):
                raise JsonSyntaxError(f"duplicate {event[1]!r}")
            call.key = event[1]
            call.seen.add(event[1])
        elif kind == "value_start" and event[1] == 1:
            call.value_start = at
            if call.key == "arguments":
                if call.raw[at] != "{":
                    raise JsonSyntaxError("arguments must be an object")
                call.args_open = True
        elif kind == "value_end" and event[1] == 1:
            value = call.raw[call.value_start: at + 1 if event[2] else at]
            if call.key == "name":
                self._got_name(call, json.loads(value))
            elif call.key == "arguments":
                call.args_open, call.args_done = False, True
                call.args += call.raw[at] if event[2] else ""
                call.args_safe = len(call.args)

    def _got_name(self, call: _Call, name: object) -> None:
        if not isinstance(name, str):
            raise JsonSyntaxError("name must be a string")
        call.name = name
        call.announced = True
        self._calls += 1
        self._out.append(ToolCallStart(call.index, name))

    def _send_args(self, call: _Call) -> None:
        if call.announced and call.args_safe > call.args_sent:
            self._out.append(ToolCallArguments(call.index, call.args[call.args_sent:call.args_safe]))
            call.args_sent = call.args_safe

    def _close_call(self) -> None:
        """The call's object closed: a valid call when it was announced."""
        call = self._call
        if not call.announced:
            self._broken_call(None)
            return
        if not call.args_done:
            self._out.append(ToolCallArguments(call.index, "{}"))
        self._out.append(ToolCallEnd(call.index))
        self._call, self._mode, self._held = None, "after_call", ""

    def _broken_call(self, offending: str | None) -> None:
        """The documented invalid-call rule (module docstring)."""
        call = self._call
        self._call = None
        if call.announced:
            self._finish_truncated(call)
            self._mode, self._held = "discard", ""
            if offending is not None:
                self._discard_char(offending)
            return
        raw = call.raw if offending is None else call.raw[:-1]
        self._content(START_TAG + raw)
        self._mode, self._held = "text", ""
        if offending is not None:
            self._text_char(offending)

    def _finish_truncated(self, call: _Call) -> None:
        if not call.args_sent and not call.args_safe:
            self._out.append(ToolCallArguments(call.index, "{}"))
        else:
            self._send_args(call)
            if not call.args_done:
                # Close what was sent: replay the checker up to the safe point for its closers.
                scanner = JsonScanner()
                for ch in call.args[:call.args_safe]:
                    scanner.push(ch)
                self._out.append(ToolCallArguments(call.index, scanner.closers()))
        self._out.append(ToolCallEnd(call.index))

    def _end_of_call_text(self) -> None:
        """The text ended inside a call's body."""
        call = self._call
        if call.announced:
            self._call = None
            self._finish_truncated(call)
        else:
            self._broken_call(None)


def _coalesce(events: list[Event]) -> list[Event]:
    """Merge neighbouring content deltas (and argument pieces of one call)."""
    merged: list[Event] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            merged[-1] = ContentDelta(last.text + event.text)
        elif (isinstance(event, ToolCallArguments) and isinstance(last, ToolCallArguments)
              and last.index == event.index):
            merged[-1] = ToolCallArguments(event.index, last.text + event.text)
        else:
            merged.append(event)
    return merged


def assemble(events: list[Event]) -> ParsedMessage:
    """The message a list of events describes (what a streaming client accumulates)."""
    content: list[str] = []
    calls: dict[int, ParsedToolCall] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ToolCallStart):
            calls[event.index] = ParsedToolCall(event.name, "")
        elif isinstance(event, ToolCallArguments):
            calls[event.index].arguments += event.text
    return ParsedMessage("".join(content), [calls[i] for i in sorted(calls)])


def parse_hermes(text: str, prefix: str = "") -> ParsedMessage:
    """Non-streaming parse of a whole output (``prefix``: text fed first, e.g. a forced call's start)."""
    parser = HermesParser()
    events = parser.feed(prefix) + parser.feed(text) + parser.finish()
    return assemble(events)
