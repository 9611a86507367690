"""The ``astrai_plugin_verifiers_harness`` harness (a verifiers harness id is a top-level
module): verifiers' own chat loop (the program of
its ``null`` harness: chat completions, MCP tools, until a reply without tool calls), run
with this Python instead of a ``uv`` script environment.

verifiers prepares its built-in programs with ``uv``, which downloads their dependencies;
the loop's dependencies (openai, mcp, httpx, tenacity, certifi) are verifiers' own, so they
are already installed here, and a run needs no network.
"""

from __future__ import annotations

import sys
from typing import Any

from verifiers.v1.harnesses.null import NullHarness
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

HARNESS_ID = "astrai_plugin_verifiers_harness"


class _ThisPython:
    """A runtime whose script programs run with this interpreter (everything else delegated)."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None,
                                *, activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = "astrai-chat-program.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


class LocalChatHarness(NullHarness):
    """verifiers' chat loop, run with this interpreter (see the module docstring)."""

    async def setup(self, runtime: Any) -> None:
        return None  # nothing to install: the program runs with this interpreter

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any,
                     tool_interception_url: str | None = None) -> Any:
        system_prompt, prompt = self.resolve_prompt(data)
        extra = [f"--tool-interception-url={tool_interception_url}"] if tool_interception_url else []
        return await launch_chat_program(CHAT_PROGRAM_SOURCE, self.config, ctx, trace,
                                         _ThisPython(runtime), endpoint, secret, mcp_urls,
                                         system_prompt, prompt, extra_args=extra)


__all__ = ["LocalChatHarness"]
