"""Fixtures of the Tinker tests: a tiny float32 base model (a Hugging Face llama directory,
imported natively) and helpers to build engines and datums on it; a live ``astrai tinker``
app (uvicorn in a thread on 127.0.0.1, a free port) for the SDK tests."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest

from astrai_core.testing.hf_models import write_hf_model_dir
from astrai_core.tinker.bases import load_base
from astrai_core.tinker.engine import EngineLimits, TorchEngine
from astrai_core.tinker.engine_types import DatumIn
from tests.tinker.fake_engine import FakeEngine

BASE = "tiny/llama"


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_model_dir(tmp_path_factory.mktemp("tinker") / "llama", "llama")


@pytest.fixture
def make_engine(hf_dir: Path, tmp_path: Path):
    """``make_engine(state_dir=None, **limits)``: a fresh engine on its own copy of the base."""

    def make(state_dir: Path | None = None, **limits) -> TorchEngine:
        base = load_base(BASE, str(hf_dir), cache_dir=str(tmp_path / "imports"))
        return TorchEngine([base], state_dir or tmp_path / "state", EngineLimits(**limits))

    return make


def sft_datums(seed: int = 0, lengths: tuple[int, ...] = (9, 6, 4), vocab: int = 60
               ) -> tuple[list[DatumIn], list[np.ndarray], list[np.ndarray]]:
    """(datums, the full rows, their loss masks): row r's datum is row[:-1] -> row[1:]
    with weights = loss_mask[1:] (the first two tokens are a prompt, not trained)."""
    rng = np.random.default_rng(seed)
    datums, rows, masks = [], [], []
    for length in lengths:
        row = rng.integers(1, vocab, length + 1)
        mask = np.ones(length + 1, dtype=np.float32)
        mask[:2] = 0.0
        datums.append(DatumIn([int(t) for t in row[:-1]],
                              {"target_tokens": row[1:].astype(np.int64), "weights": mask[1:]}))
        rows.append(row)
        masks.append(mask)
    return datums, rows, masks


def policy_datums(seed: int = 1, lengths: tuple[int, ...] = (8, 5)) -> list[DatumIn]:
    """Datums for the policy losses: sampler log-probs near the model's, signed advantages."""
    rng = np.random.default_rng(seed)
    datums = []
    for length in lengths:
        tokens = rng.integers(1, 60, length + 1)
        datums.append(DatumIn([int(t) for t in tokens[:-1]], {
            "target_tokens": tokens[1:].astype(np.int64),
            "logprobs": (-4.1 + rng.normal(0, 0.3, length)).astype(np.float32),
            "advantages": rng.normal(0, 1, length).astype(np.float32)}))
    return datums


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
        self.clients: list = []

    def client(self, api_key: str = KEY):
        """An SDK client of this server, closed with it (its heartbeats stop before the
        server does, so they log no connection errors after the test)."""
        import tinker

        client = tinker.ServiceClient(base_url=self.base_url, api_key=api_key)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            close_sdk_client(client)
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


def close_sdk_client(client) -> None:
    """Finish ``client``'s session and stop its background tasks; a client that cannot
    reach the server (a wrong key, a closed session) is closed locally all the same."""
    with suppress(Exception):
        client.close("success").result(timeout=10)
    _stop_locally(client)


def _stop_locally(client) -> None:
    """Stop a client's heartbeat and pollers without a request: its server may be gone."""
    for holder in (client._session_holder, client._rest_holder):
        if holder is not None:
            holder.close()


@pytest.fixture(autouse=True)
def _sdk_clients_stopped(monkeypatch):
    """Every SDK client a test made (the cookbook's too) stops its heartbeat when the
    test ends: left running, it would log failed heartbeats into later tests."""
    try:
        import tinker
    except ImportError:
        yield
        return
    made = []
    init = tinker.ServiceClient.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(tinker.ServiceClient, "__init__", recording_init)
    yield
    for client in made:
        _stop_locally(client)


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
