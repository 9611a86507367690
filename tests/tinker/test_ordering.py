"""A model's requests run in ``seq_id`` order, and a retried request runs once."""

from __future__ import annotations

import time

import httpx
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

from tests.tinker.fake_engine import BASE  # noqa: E402
from tests.tinker.test_sdk_training import ROWS  # noqa: E402

PROTO = {"Content-Type": "application/x-protobuf"}


def _fwd(model_id: str, seq_id: int) -> bytes:
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=ROWS, loss_fn="cross_entropy"),
        model_id=model_id, seq_id=seq_id)
    return forward_backward_request_to_proto(request).SerializeToString()


def _result(http: httpx.Client, request_id: str) -> httpx.Response:
    while (r := http.post("/api/v1/retrieve_future", json={"request_id": request_id})).headers[
            "content-type"].startswith("application/json") and r.json().get("type") == "try_again":
        pass
    return r


def test_out_of_order_requests_wait_and_retries_run_once(server, fake):
    with httpx.Client(base_url=server.base_url, headers={"X-API-Key": "tml-test-key"}, timeout=60) as http:
        session = http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x",
                                                            "user_metadata": None}).json()["session_id"]
        create = {"session_id": session, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 2}}
        created = http.post("/api/v1/create_model", json=create).json()
        assert http.post("/api/v1/create_model", json=create).json() == created  # a retry: the same request
        model_id = _result(http, created["request_id"]).json()["model_id"]
        second = http.post("/api/v1/optim_step", json={"model_id": model_id, "seq_id": 2,
                                                       "adam_params": {"learning_rate": 0.1}}).json()
        time.sleep(0.3)
        assert fake.log == []  # seq 2 waits for seq 1
        first = http.post("/api/v1/forward_backward", content=_fwd(model_id, 1), headers=PROTO).json()
        retried = http.post("/api/v1/forward_backward", content=_fwd(model_id, 1), headers=PROTO).json()
        assert retried["request_id"] == first["request_id"]
        assert _result(http, second["request_id"]).json()["metrics"]["grad_norm:mean"] > 0
        assert _result(http, first["request_id"]).headers["content-type"] == "application/x-protobuf"
        assert fake.log == [("forward_backward", model_id), ("optim_step", model_id)]
