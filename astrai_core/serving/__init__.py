"""``astrai serve``: an OpenAI-compatible HTTP server over the native model.

Modules: ``hermes`` (incremental tool-call parser, reusable on its own), ``json_scan``
(its JSON checker), ``detokenize`` (incremental detokenizer and stop-string holdback),
``engine`` (continuous batching over the KV cache), ``protocol`` (request/response
models), ``parse`` and ``prepare`` (a body -> engine requests, off the event loop),
``limits`` and ``connections`` (what one client may cost: body size, timeouts,
connections), ``app`` (the FastAPI application). Importing this package imports nothing heavy;
FastAPI and torch load in ``app`` and ``engine``.
"""

from astrai_core.serving.hermes import (
    ContentDelta, HermesParser, ParsedMessage, ParsedToolCall, ToolCallArguments, ToolCallEnd, ToolCallStart,
    assemble, parse_hermes,
)

__all__ = ["ContentDelta", "HermesParser", "ParsedMessage", "ParsedToolCall", "ToolCallArguments", "ToolCallEnd",
           "ToolCallStart", "assemble", "parse_hermes"]
