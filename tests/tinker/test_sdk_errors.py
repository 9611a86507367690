"""Bad input through the SDK: a 4xx in the SDK's error shape, a message naming the problem,
and a server that keeps working afterwards."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from tests.tinker.fake_engine import BASE  # noqa: E402
from tests.tinker.test_sdk_training import ROWS, datum  # noqa: E402


def assert_still_serves(server) -> None:
    trainer = server.client().create_lora_training_client(base_model=BASE, rank=2).result()
    assert trainer.forward(ROWS, "cross_entropy").result().metrics["loss:sum"] > 0


def test_unknown_base_model_and_rank_too_large(server):
    service = server.client()
    with pytest.raises(tinker.BadRequestError, match="unknown base model 'no/such'.*offers: tiny/base"):
        service.create_lora_training_client(base_model="no/such", rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="lora rank 64 is out of range.*1 to 8"):
        service.create_lora_training_client(base_model=BASE, rank=64).result()
    assert_still_serves(server)


def test_token_out_of_range_and_mismatched_shape_then_the_client_goes_on(server):
    trainer = server.client().create_lora_training_client(base_model=BASE, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="datum 0: token id 999 is out of range"):
        trainer.forward_backward([datum([1, 999], [2, 3])], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match=r"datum 1: loss_fn_inputs\['weights'\] has shape \[2\]"):
        trainer.forward_backward([ROWS[0], datum([1, 2, 3], [2, 3, 4], [1.0, 1.0])], "cross_entropy").result()
    # the refused requests used their turns: the next ones of this client still run
    assert trainer.forward_backward(ROWS, "cross_entropy").result(timeout=30).metrics["loss:sum"] > 0
    assert trainer.optim_step(types.AdamParams(learning_rate=0.1)).result(timeout=30).metrics is not None


def test_engine_refusal_arrives_as_a_failed_future(server):
    trainer = server.client().create_lora_training_client(base_model=BASE, rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="loss 'dro' is not in the fake engine") as caught:
        trainer.forward_backward(ROWS, "dro").result()
    assert caught.value.category == types.RequestErrorCategory.User


def test_image_chunks_are_refused(server):
    trainer = server.client().create_lora_training_client(base_model=BASE, rank=2).result()
    image = types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png")])
    row = types.Datum(model_input=image, loss_fn_inputs={"target_tokens": [1], "weights": [1.0]})
    with pytest.raises(tinker.BadRequestError, match="image chunks are not supported"):
        trainer.forward_backward([row], "cross_entropy").result()


def test_wrong_key_is_refused_and_the_right_one_works(server):
    with pytest.raises(tinker.AuthenticationError, match="invalid or missing API key"):
        server.client(api_key="tml-wrong").create_lora_training_client(base_model=BASE, rank=2)
    assert_still_serves(server)


def test_missing_future_unknown_model_and_bad_paths(server):
    headers = {"X-API-Key": "tml-test-key"}
    with httpx.Client(base_url=server.base_url, headers=headers) as http:
        missing = http.post("/api/v1/retrieve_future", json={"request_id": "req-nope"})
        assert missing.status_code == 404
        assert missing.json() == {"error": "unknown future 'req-nope' (never issued, or expired)",
                                  "category": "user"}
        unknown = http.post("/api/v1/get_info", json={"model_id": "abc:train:0"})
        assert unknown.status_code == 404 and "unknown model_id" in unknown.json()["error"]
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        for path in ("tinker://../../etc/weights/x", "tinker://abc:train:0/weights/../x",
                     "tinker://abc:train:0/other/x", "/etc/passwd"):
            refused = http.post("/api/v1/load_weights", json={"session_id": session, "model_seq_id": 5,
                                                               "path": path, "optimizer": False})
            assert refused.status_code == 400 and "tinker://" in refused.json()["error"], path
        assert http.get("/api/v1/healthz", headers={"X-API-Key": ""}).json() == {"status": "ok"}
        assert http.post("/api/v1/telemetry", json={"events": []}).json() == {"status": "accepted"}
        assert http.post("/api/v1/create_session", headers={"X-API-Key": "tml-wrong"}).status_code == 401


def test_token_exchange_and_body_limit(tokenizer_dir, tmp_path):
    from astrai_core.tinker.service import Limits
    from tests.tinker.conftest import live_tinker
    from tests.tinker.fake_engine import FakeEngine

    with live_tinker(FakeEngine(tokenizer_dir, tmp_path), limits=Limits(max_body_bytes=1000)) as live:
        with httpx.Client(base_url=live.base_url) as http:
            token = http.post("/api/v1/auth/token", headers={"X-API-Key": "tml-test-key"}).json()["jwt"]
            assert http.post("/api/v1/create_session", json={}, headers={"X-API-Key": token}).status_code == 200
            assert http.post("/api/v1/auth/token", headers={"X-API-Key": token}).status_code == 401
            forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
            refused = http.post("/api/v1/create_session", json={}, headers={"X-API-Key": forged})
            assert refused.status_code == 401 and "invalid_token" in refused.headers["WWW-Authenticate"]
            big = http.post("/api/v1/create_session", content=b"{" + b" " * 2000 + b"}",
                            headers={"X-API-Key": "tml-test-key", "Content-Type": "application/json"})
            assert big.status_code == 413 and "over the server's limit of 1000 bytes" in big.json()["error"]


def test_a_chunked_body_is_counted_as_it_arrives(tokenizer_dir, tmp_path):
    from astrai_core.tinker.service import Limits
    from tests.tinker.conftest import live_tinker
    from tests.tinker.fake_engine import FakeEngine

    def chunks():
        yield b"{"
        for _ in range(20):
            yield b" " * 100
        yield b"}"

    with live_tinker(FakeEngine(tokenizer_dir, tmp_path), limits=Limits(max_body_bytes=1000)) as live:
        with httpx.Client(base_url=live.base_url, headers={"X-API-Key": "tml-test-key"}) as http:
            big = http.post("/api/v1/session_heartbeat", content=chunks())
            assert big.status_code == 413 and "limit of 1000 bytes" in big.json()["error"]


def test_the_sdk_splits_calls_to_fit_the_datum_limit(tokenizer_dir, tmp_path):
    from astrai_core.tinker.service import Limits
    from tests.tinker.conftest import live_tinker
    from tests.tinker.fake_engine import FakeEngine

    rows = [datum([i + 1, i + 2], [i + 2, i + 3]) for i in range(7)]
    engine = FakeEngine(tokenizer_dir, tmp_path)
    with live_tinker(engine, limits=Limits(max_datums=2, max_datum_tokens=4)) as live:
        trainer = live.client().create_lora_training_client(base_model=BASE, rank=2).result()
        out = trainer.forward_backward(rows, "cross_entropy").result(timeout=60)
        assert len(out.loss_fn_outputs) == 7 and len(engine.returned) == 4  # 2+2+2+1, in order
        np.testing.assert_array_equal(
            np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs]),
            np.concatenate([o["logprobs"] for _, r in engine.returned for o in r.outputs]))
        with pytest.raises(tinker.BadRequestError, match="datum 0: 5 tokens; 1 to 4 allowed"):
            trainer.forward([datum([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])], "cross_entropy").result()


def test_a_body_that_is_not_protobuf_is_a_400(server):
    headers = {"X-API-Key": "tml-test-key", "Content-Type": "application/x-protobuf"}
    with httpx.Client(base_url=server.base_url, headers=headers) as http:
        refused = http.post("/api/v1/forward_backward", content=b"\x0a\xff\xff\xff")
        assert refused.status_code == 400 and "not a valid protobuf message" in refused.json()["error"]
        refused = http.post("/api/v1/optim_step", content=b"not json")
        assert refused.status_code == 400 and "not JSON" in refused.json()["error"]
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        refused = http.post("/api/v1/create_model", json={"session_id": session, "base_model": "tiny/base",
                                                          "lora_config": {"rank": "abc"}})
        assert refused.status_code == 400 and refused.json()["error"].startswith("malformed request:")
        refused = http.post("/api/v1/asample", json={"base_model": "tiny/base", "prompt": {"chunks": 5},
                                                     "sampling_params": {}})
        assert refused.status_code == 400 and refused.json()["error"].startswith("malformed request:")
    assert_still_serves(server)
