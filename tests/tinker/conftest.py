"""A live ``astrai tinker`` app (uvicorn in a thread on 127.0.0.1, a free port) for the SDK tests."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
tinker = pytest.importorskip("tinker")

from tests.tinker.fake_engine import FakeEngine  # noqa: E402

KEY = "tml-test-key"


class LiveTinker:
    def __init__(self, engine, api_key: str | None = KEY, limits=None) -> None:
        import uvicorn

        from astrai_core.tinker.app import create_app

        self.engine = engine
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(128)
        self.base_url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        app = create_app(engine, api_key=api_key, limits=limits, state_dir=engine.state_dir)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()

    def client(self, api_key: str = KEY):
        return tinker.ServiceClient(base_url=self.base_url, api_key=api_key)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


@contextmanager
def live_tinker(engine, **kwargs):
    server = LiveTinker(engine, **kwargs)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from astrai_core.testing.parity import write_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tinker-tok")
    write_tiny_tokenizer(directory)
    return directory


@pytest.fixture
def fake(tokenizer_dir, tmp_path) -> FakeEngine:
    return FakeEngine(tokenizer_dir, tmp_path / "state")


@pytest.fixture
def server(fake):
    with live_tinker(fake) as live:
        yield live
