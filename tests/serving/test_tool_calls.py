"""End-to-end tool calls: a tiny model fitted to replay a Hermes call, read by the openai client."""

from __future__ import annotations

import json

from tests.serving.conftest import TOOL_QUESTION, TOOLS


def test_non_streamed_tool_call(tool_server):
    out = tool_server.client().chat.completions.create(model="tool-model", messages=TOOL_QUESTION, tools=TOOLS,
                                                       temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_tool_call_through_the_client_accumulator(tool_server):
    """The client's stream helper parses strict tools' arguments at every chunk (partial JSON)."""
    client = tool_server.client()
    with client.chat.completions.stream(model="tool-model", messages=TOOL_QUESTION, tools=TOOLS,
                                        temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.parsed_arguments == {"city": "Paris"}
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    deltas = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(deltas) > 1  # the arguments streamed in pieces


def test_stream_frames_send_id_name_type_once(tool_server):
    chunks = list(tool_server.client().chat.completions.create(
        model="tool-model", messages=TOOL_QUESTION, tools=TOOLS, temperature=0, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert {tc.index for tc in calls} == {0}
    assert sum(tc.id is not None for tc in calls) == 1
    assert sum(tc.type is not None for tc in calls) == 1
    assert sum(tc.function.name is not None for tc in calls) == 1
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}


def test_tool_choice_none_returns_no_calls(tool_server):
    out = tool_server.client().chat.completions.create(model="tool-model", messages=TOOL_QUESTION, tools=TOOLS,
                                                       tool_choice="none", temperature=0, max_tokens=40)
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason in ("stop", "length")


def test_named_tool_choice_forces_that_function(tool_server):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = tool_server.client().chat.completions.create(model="tool-model", messages=TOOL_QUESTION, tools=TOOLS,
                                                       tool_choice=choice, temperature=0, max_tokens=40)
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    json.loads(call.function.arguments)  # always valid JSON, even from a tiny model
