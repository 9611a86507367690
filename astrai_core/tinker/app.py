"""The FastAPI app under ``/api/v1/`` that the official Tinker SDK talks to.

Requests that queue engine work answer at once with ``{"request_id": …}``; the SDK then
polls ``retrieve_future``. Refusals use the SDK's error shape, ``{"error", "category"}``,
with a 4xx: at submission as the HTTP status, later as the future's result.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from astrai_core.tinker import routes_train, routes_sample
from astrai_core.tinker.auth import KeyCheck
from astrai_core.tinker.ckpt_index import CheckpointIndex
from astrai_core.tinker.engine_types import Engine, EngineRequestError
from astrai_core.tinker.futures import FutureStore
from astrai_core.tinker.http_json import error, read_json
from astrai_core.tinker.protowire import ProtoError
from astrai_core.tinker.service import Limits, TinkerService

OPEN_PATHS = {"/api/v1/healthz"}
POLL_WAIT_S = 20.0  # how long retrieve_future holds a pending request before try_again
SESSION_IDLE_S = 300.0  # the SDK heartbeats every 10 s; a session silent this long is finished


async def _reap_idle_sessions(svc: TinkerService) -> None:
    """Finish abandoned sessions (a client that died), so their adapters are freed."""
    while True:
        await asyncio.sleep(SESSION_IDLE_S / 10)
        svc.reap(SESSION_IDLE_S)


def create_app(engine: Engine, *, api_key: str | None = None, limits: Limits | None = None,
               state_dir: Path | None = None) -> FastAPI:
    """The app serving ``engine``; ``state_dir``: where the engine saves, to find what a
    checkpoint was trained on after a restart."""
    keys = KeyCheck(api_key)
    limits = limits or Limits()
    state: dict[str, TinkerService] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        svc = state["svc"] = TinkerService(engine, FutureStore(asyncio.get_running_loop()), limits,
                                           CheckpointIndex(state_dir))
        reaper = asyncio.create_task(_reap_idle_sessions(svc))
        try:
            yield
        finally:
            reaper.cancel()
            await asyncio.to_thread(svc.close)

    app = FastAPI(title="astrai tinker", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.max_body_bytes = limits.max_body_bytes

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        if request.url.path not in OPEN_PATHS and not keys.allows(request.headers.get("x-api-key")):
            return error(401, "invalid or missing API key (X-API-Key)",
                         headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limits.max_body_bytes:
            return error(413, f"request body of {int(size)} bytes is over the server's limit of "
                              f"{limits.max_body_bytes} bytes")
        return await call_next(request)

    @app.exception_handler(EngineRequestError)
    async def _refused(_request: Request, exc: EngineRequestError) -> JSONResponse:
        return error(exc.status, str(exc))

    @app.exception_handler(ProtoError)
    async def _bad_proto(_request: Request, exc: ProtoError) -> JSONResponse:
        return error(400, f"request body is not a valid protobuf message: {exc}")

    # A field of the wrong type (rank "abc", a list where a number goes) fails while a
    # route reads it: the client's mistake, answered 400 (a 5xx would make the SDK retry).
    @app.exception_handler(ValueError)
    @app.exception_handler(TypeError)
    async def _bad_field(_request: Request, exc: Exception) -> JSONResponse:
        return error(400, f"malformed request: {exc}")

    _service_routes(app, keys, state)
    _future_routes(app, state)
    routes_train.register(app, state)
    routes_sample.register(app, state)
    return app


def _service_routes(app: FastAPI, keys: KeyCheck, state: dict[str, TinkerService]) -> None:
    @app.get("/api/v1/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/api/v1/auth/token")
    async def auth_token(request: Request) -> Response:
        if not keys.is_key(request.headers.get("x-api-key")):  # a token cannot renew itself
            return error(401, "exchange the API key itself for a token")
        return JSONResponse({"jwt": keys.mint()})

    @app.post("/api/v1/client/config")
    async def client_config() -> dict:
        lim = state["svc"].limits
        return {"pjwt_auth_enabled": True, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                "fwdbwd_max_chunk_len": lim.max_datums, "sample_use_retrieve_futures": True,
                # the SDK splits a forward_backward into requests of at most this many bytes
                "fwdbwd_max_chunk_bytes_count": min(5_000_000, lim.max_body_bytes // 2),
                "custom_loss_server_side": False, "sample_join_sampling_session": True}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict:
        return {"sample_cancel_enabled": False}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}  # accepted and dropped: nothing leaves this machine

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict:
        return {"supported_models": [
            {"model_name": b.name, "max_context_length": b.max_context, "trainable": True, "sampleable": True}
            for b in state["svc"].bases.values()]}

    @app.post("/api/v1/create_session")
    async def create_session() -> dict:
        return {"type": "create_session", "session_id": state["svc"].new_session()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict:
        state["svc"].session(str((await read_json(request)).get("session_id")))
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> dict:
        state["svc"].finish_session(session_id)
        return {}


def _future_routes(app: FastAPI, state: dict[str, TinkerService]) -> None:
    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id = str((await read_json(request)).get("request_id"))
        try:
            payload = await state["svc"].futures.wait(request_id, POLL_WAIT_S)
        except KeyError:
            return error(404, f"unknown future {request_id!r} (never issued, or expired)")
        if payload is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        return Response(payload.body, media_type=payload.media_type)

    @app.post("/api/v1/retrieve_futures")
    async def retrieve_futures(request: Request) -> dict:
        body = await read_json(request)
        target = body.get("target") or {}
        feed = (str(target.get("sampling_session_id")), int(target.get("cloned_sampler_id", 0)))
        state["svc"].sampler(feed[0])
        timeout = body.get("timeout")
        wait = POLL_WAIT_S if timeout is None else max(0.0, min(float(timeout), POLL_WAIT_S))
        items, cursor = await state["svc"].futures.completions(feed, int(body.get("prev_cursor", 0)), wait)
        return {"completions": items, "cursor": cursor}

    @app.post("/api/v1/cancel_future")
    async def cancel_future() -> dict:
        return {}  # queued work is short; it finishes and is dropped unread
