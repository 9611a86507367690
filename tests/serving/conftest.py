"""Live servers for the serving tests (``astrai_core.testing.serving.live_server``: uvicorn in a thread on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from astrai_core.testing import serving as testkit  # noqa: E402
from astrai_core.testing.serving import live_server  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
TOOL_QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
TOOL_ANSWER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="session")
def random_checkpoint(tmp_path_factory) -> Path:
    return testkit.build_checkpoint(tmp_path_factory.mktemp("serve") / "random")


@pytest.fixture(scope="session")
def tool_checkpoint(tmp_path_factory) -> Path:
    """A tiny model fitted so that greedy decoding of TOOL_QUESTION (with TOOLS) replays TOOL_ANSWER."""
    from astrai_core.data.tokenizer import load_tokenizer

    directory = testkit.build_checkpoint(tmp_path_factory.mktemp("serve") / "tools", seed=1)
    tokenizer = load_tokenizer(directory)
    text = tokenizer.apply_chat_template(TOOL_QUESTION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer = tokenizer(TOOL_ANSWER, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    testkit.train_to_replay(directory, [(prompt, answer)])
    return directory


@pytest.fixture(scope="module")
def server(random_checkpoint):
    with live_server(random_checkpoint) as live:
        yield live


@pytest.fixture(scope="module")
def tool_server(tool_checkpoint):
    with live_server(tool_checkpoint, name="tool-model") as live:
        yield live
