"""The service's bookkeeping without HTTP: idle sessions are finished and their adapters freed."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")

from astrai_core.tinker.engine_types import LoraSpec  # noqa: E402
from astrai_core.tinker.futures import FutureStore  # noqa: E402
from astrai_core.tinker.service import Limits, TinkerService  # noqa: E402
from tests.tinker.fake_engine import BASE  # noqa: E402


def test_idle_sessions_are_finished_and_their_models_unloaded(fake):
    loop = asyncio.new_event_loop()
    svc = TinkerService(fake, FutureStore(loop), Limits())
    idle, alive = svc.new_session(), svc.new_session()
    models = [svc.create_model(s, 0, svc.base(BASE), LoraSpec(rank=2))[0].model_id for s in (idle, alive)]
    svc.sessions[idle].last_seen -= 1000
    assert svc.reap(300) == [idle]
    svc.close()  # runs the queued unload
    loop.close()
    assert models[0] not in fake.w and models[0] not in svc.models
    assert models[1] in fake.w and models[1] in svc.models and not svc.sessions[alive].finished


def test_the_adapter_limit_is_a_429_naming_it(fake):
    svc = TinkerService(fake, FutureStore(asyncio.new_event_loop()), Limits(max_adapters=1))
    session = svc.new_session()
    svc.create_model(session, 0, svc.base(BASE), LoraSpec(rank=2))
    with pytest.raises(Exception, match="at most 1 adapters") as caught:
        svc.create_model(session, 1, svc.base(BASE), LoraSpec(rank=2))
    assert caught.value.status == 429
    svc.close()


def test_a_result_once_read_is_forgotten_after_a_while(monkeypatch):
    from astrai_core.tinker import futures
    from astrai_core.tinker.futures import json_payload

    async def scenario() -> None:
        store = FutureStore(asyncio.get_running_loop())
        first = store.create()
        assert await store.wait(first, 0.01) is None  # pending: try again
        store.resolve(first, json_payload({"ok": 1}))
        assert (await store.wait(first, 1.0)).body == b'{"ok": 1}'
        assert (await store.wait(first, 1.0)).body == b'{"ok": 1}'  # a broken-off read may repeat
        monkeypatch.setattr(futures, "KEEP_SERVED_S", 0.0)
        store.create()
        with pytest.raises(KeyError):
            await store.wait(first, 0.01)

    asyncio.run(scenario())
