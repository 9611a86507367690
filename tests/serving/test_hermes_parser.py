"""The Hermes parser: every chunking of a scripted output reconstructs its non-streaming parse.

Expected results are written by hand; streamed argument prefixes are checked with jiter's
partial mode, the parser the ``openai`` client uses for strict tools.
"""

from __future__ import annotations

import json

import jiter
import pytest

from astrai_core.serving.hermes import (
    ContentDelta, HermesParser, ParsedToolCall, ToolCallArguments, ToolCallEnd, ToolCallStart,
    assemble, parse_hermes,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'

# name -> (model output, expected content, expected [(name, arguments dict)])
CASES = {
    "plain text": ("Hello, world! 1 < 2 and <b>bold</b>.", "Hello, world! 1 < 2 and <b>bold</b>.", []),
    "trailing tag prefix": ("The tag is <tool_", "The tag is <tool_", []),
    "close tag inside a string": (
        'Sure.<tool_call>{"name": "echo", "arguments": {"text": "a </tool_call> b \\" }"}}</tool_call>',
        "Sure.", [("echo", {"text": 'a </tool_call> b " }'})]),
    "arguments before name": (
        '<tool_call>{"arguments": {"q": [1, {"r": null}], "s": "x"}, "name": "search"}</tool_call>',
        "", [("search", {"q": [1, {"r": None}], "s": "x"})]),
    "two calls": (CALL + "\n" + '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>',
                  "\n", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]),
    "invalid json before the name": ('<tool_call>{"name": get_weather}</tool_call> ok',
                                     '<tool_call>{"name": get_weather}</tool_call> ok', []),
    "invalid json in the arguments": (
        '<tool_call>{"name": "f", "arguments": {"a": 12, "b": tru}}</tool_call>after',
        "after", [("f", {"a": 12})]),
    "no name": ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    "text after the call": (CALL + " Anything else?", " Anything else?",
                            [("get_weather", {"city": "Paris", "days": 3})]),
    "emoji split across tokens": ("Sunny \U0001F31E today <tool_call>{\"name\": \"note\", \"arguments\": "
                                  "{\"t\": \"\U0001F31E\"}}</tool_call>",
                                  "Sunny \U0001F31E today ", [("note", {"t": "\U0001F31E"})]),
    "cut inside the arguments": ('<tool_call>{"name": "f", "arguments": {"path": "/tm',
                                 "", [("f", {"path": "/tm"})]),
    "cut before the name": ('ok <tool_call>{"na', 'ok <tool_call>{"na', []),
    "missing arguments": ('<tool_call>{"name": "ping"}</tool_call>', "", [("ping", {})]),
}


def _stream(text: str, size: int) -> list:
    parser = HermesParser()
    events = []
    for start in range(0, len(text), size):
        events += parser.feed(text[start:start + size])
    return events + parser.finish()


@pytest.mark.parametrize("name", list(CASES))
def test_every_chunking_reconstructs_the_non_streaming_parse(name):
    text, content, calls = CASES[name]
    whole = parse_hermes(text)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == calls
    for size in range(1, len(text) + 1):
        events = _stream(text, size)
        assert assemble(events) == whole, f"chunk size {size}"
        _check_stream_shape(events)


def _check_stream_shape(events) -> None:
    """Dense indexes announced once, in order; every arguments prefix is valid partial JSON."""
    announced: list[int] = []
    arguments: dict[int, str] = {}
    for event in events:
        if isinstance(event, ToolCallStart):
            assert event.index == len(announced)
            announced.append(event.index)
            arguments[event.index] = ""
        elif isinstance(event, ToolCallArguments):
            assert event.index == announced[-1]
            arguments[event.index] += event.text
            jiter.from_json(arguments[event.index].encode(), partial_mode="trailing-strings")
        elif isinstance(event, ToolCallEnd):
            json.loads(arguments[event.index])
        else:
            assert isinstance(event, ContentDelta) and event.text


def test_content_streams_at_once_and_only_a_tag_prefix_is_held():
    parser = HermesParser()
    assert parser.feed("Hi there ") == [ContentDelta("Hi there ")]
    assert parser.feed("<tool") == []
    assert parser.feed("kit") == [ContentDelta("<toolkit")]
    assert parser.feed("<tool_call>") == []
    assert parser.feed('{"name": "f"') == [ToolCallStart(0, "f")]
    assert parser.feed(', "arguments": {"a": "b') == [ToolCallArguments(0, '{"a": "b')]
    assert parser.feed('c"}}</tool_call>') == [ToolCallArguments(0, 'c"}'), ToolCallEnd(0)]
    assert parser.finish() == []


def test_either_key_order_gives_the_same_call():
    first = parse_hermes('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    second = parse_hermes('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>')
    assert first == second
    assert first.tool_calls == [ParsedToolCall("f", '{"x": 1}')]


def test_arguments_are_the_raw_span_the_model_wrote():
    raw = '{"b": 1,   "a": [2.50, "\\u00e9"]}'
    message = parse_hermes(f'<tool_call>{{"name": "f", "arguments": {raw} }}</tool_call>')
    assert message.tool_calls[0].arguments == raw


def test_prefix_feeds_a_forced_call_start():
    message = parse_hermes('{"x": 2}}</tool_call>', prefix='<tool_call>\n{"name": "f", "arguments": ')
    assert message == parse_hermes('<tool_call>\n{"name": "f", "arguments": {"x": 2}}</tool_call>')
