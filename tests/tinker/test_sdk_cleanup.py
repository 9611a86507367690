"""The test servers close their SDK clients: each session is finished on the server and
the client's heartbeat stops, so no client keeps calling a server that has gone."""

from __future__ import annotations

import time

import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

from tests.tinker.conftest import live_tinker  # noqa: E402
from tests.tinker.fake_engine import BASE  # noqa: E402


def test_a_live_server_finishes_its_clients_sessions_when_it_stops(fake):
    with live_tinker(fake) as live:
        service = live.client()
        trainer = service.create_lora_training_client(base_model=BASE, rank=2).result()
        holder = service._session_holder
        assert trainer.model_id in fake.w
    for _ in range(100):  # the server unloads a finished session's models in its queue
        if trainer.model_id not in fake.w:
            break
        time.sleep(0.05)
    assert trainer.model_id not in fake.w  # the session was finished: its model unloaded
    assert holder._closed  # and the client's background tasks stopped
