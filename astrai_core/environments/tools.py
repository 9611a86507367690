"""The ``tools`` environment: plain Python functions as tools, in the OpenAI tool format.

``environment: {name: tools, tools: ["mypkg.tools:calculator"], timeout: 5}``. Each
function is described by its signature (parameter names, annotations, defaults) and the
first paragraph of its docstring, as an OpenAI ``{"type": "function", "function": {...}}``
record (:attr:`Tools.schemas`, for a chat template's ``tools=``). At each turn every tool
call runs on its own thread, all calls of a turn at once, each bounded by ``timeout``;
the result (``str`` as is, anything else as JSON) becomes a tool message. An unknown
tool, arguments that are not a JSON object or do not fit the signature, an exception and
a timeout each become an error message the model sees, and the episode goes on. A turn
without tool calls ends the episode (the reward functions score it).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astrai_core.environments.base import AssistantTurn, EnvMessage, EnvStep, ToolCall, error_message
from astrai_core.environments.timeouts import start_call
from astrai_core.plugins.specs import import_target

# tools named by a short name in ``tools:``
BUILTIN_TOOLS = {"python": "astrai_core.environments.python_tool:python",
                 "calculator": "astrai_core.environments.calculator:calculator"}
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean",
               list: "array", tuple: "array", dict: "object"}


def tool_schema(function: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI tool record describing ``function`` by its signature and docstring."""
    hints = get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        kind = _JSON_TYPES.get(getattr(hints.get(parameter.name), "__origin__", None)
                               or hints.get(parameter.name))
        properties[parameter.name] = {"type": kind} if kind else {}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    doc = inspect.getdoc(function) or ""
    return {"type": "function", "function": {
        "name": name or function.__name__,
        "description": doc.split("\n\n")[0].replace("\n", " ").strip(),
        "parameters": {"type": "object", "properties": properties, "required": required}}}


class Tools:
    """The ``tools`` environment; see the module docstring."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        tools: list[str] = Field(min_length=1, description='"module:function" of each tool, '
                                 'or a built-in tool: python, calculator')
        timeout: float = Field(10.0, gt=0, description="seconds each tool call may take")
        max_result_chars: int = Field(2000, ge=1, description="longer results are cut")
        tools_in_prompt: bool = Field(
            True, description="give the tools' OpenAI schemas to the chat template of every "
            "prompt (apply_chat_template(tools=...)), as a server does; a template that does "
            "not render tools is unaffected")

        @field_validator("tools")
        @classmethod
        def _importable(cls, value: list[str]) -> list[str]:
            for target in value:
                function = _import_tool(target)
                if not callable(function):
                    raise ValueError(f"tool {target!r} is not callable")
            return value

    def __init__(self, **options: Any) -> None:
        self.config = self.Config(**options)
        self.functions: dict[str, Callable[..., Any]] = {}
        for target in self.config.tools:
            function = _import_tool(target)
            self.functions[getattr(function, "__name__", target.rpartition(":")[2])] = function
        self.schemas = [tool_schema(f, name) for name, f in self.functions.items()]
        self.prompt_tools = self.schemas if self.config.tools_in_prompt else None

    def reset(self, row: Mapping[str, Any]) -> None:
        return None

    def step(self, state: None, turn: AssistantTurn) -> EnvStep:
        if not turn.tool_calls:
            return EnvStep(done=True)
        pending = [(call, self._start(call)) for call in turn.tool_calls]
        return EnvStep(messages=tuple(self._finish(call, started) for call, started in pending))

    def _start(self, call: ToolCall) -> Any:
        """The running call, or the error message it gets without running."""
        function = self.functions.get(call.name)
        if function is None:
            return error_message(call, f"unknown tool {call.name!r}; tools: "
                                 f"{', '.join(self.functions)}")
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            inspect.signature(function).bind(**arguments)
        except (ValueError, TypeError) as exc:
            return error_message(call, f"bad arguments for {call.name}: {exc}")
        return start_call(function, name=f"astrai-tool-{call.name}", **arguments)

    def _finish(self, call: ToolCall, started: Any) -> EnvMessage:
        if isinstance(started, EnvMessage):
            return started
        try:
            value = started.result(self.config.timeout)
        except Exception as exc:  # the tool's own failure or CallTimeout: the model sees it
            return error_message(call, f"{call.name}: {type(exc).__name__}: {exc}")
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return EnvMessage(content=text[:self.config.max_result_chars], name=call.name,
                          tool_call_id=call.id or None)


def _import_tool(target: str) -> Any:
    target = BUILTIN_TOOLS.get(target, target)
    if ":" not in target:
        raise ValueError(f"tool {target!r} must look like 'package.module:function' or be "
                         f"a built-in tool ({', '.join(BUILTIN_TOOLS)})")
    try:
        return import_target(target)
    except Exception as exc:
        raise ValueError(f"tool {target!r} cannot be imported ({type(exc).__name__}: {exc})") from None
