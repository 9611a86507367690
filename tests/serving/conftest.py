"""Live servers for the serving tests: uvicorn in a thread on 127.0.0.1, a socket bound first.

The listening socket exists before the server thread starts, so a client can connect at
once (the connection waits in the backlog): no polling for readiness.
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from astrai_core.serving import testkit  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
TOOL_QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
TOOL_ANSWER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class LiveServer:
    def __init__(self, model_dir: Path, name: str = "tiny", max_batch_size: int = 32) -> None:
        import uvicorn

        from astrai_core.data.tokenizer import load_tokenizer
        from astrai_core.model import load_pretrained
        from astrai_core.serving.app import create_app
        from astrai_core.serving.engine import BatchingEngine

        self.model = load_pretrained(model_dir).eval()
        self.tokenizer = load_tokenizer(model_dir)
        self.engine = BatchingEngine(self.model, self.tokenizer, max_batch_size=max_batch_size)
        self.name = name
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(create_app(self.engine, model_name=name), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def async_client(self):
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def chat_prompt_ids(self, messages, tools=None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.close()
        self.socket.close()


@contextmanager
def live_server(model_dir: Path, **kwargs):
    server = LiveServer(model_dir, **kwargs)
    try:
        yield server
    finally:
        server.close()


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
