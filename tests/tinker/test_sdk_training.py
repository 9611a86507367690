"""The official Tinker SDK against the HTTP layer, with a stand-in engine."""

from __future__ import annotations

import time

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from astrai_core.tinker.engine_types import SampleSpec  # noqa: E402
from tests.tinker.fake_engine import BASE  # noqa: E402


def datum(tokens: list[int], targets: list[int], weights: list[float] | None = None) -> types.Datum:
    weights = weights if weights is not None else [1.0] * len(targets)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": targets, "weights": weights})


ROWS = [datum([1, 2, 3, 4], [2, 3, 4, 5], [0.0, 1.0, 1.0, 1.0]), datum([7, 8, 9], [8, 9, 10])]


def trained_client(server):
    """A service client and a training client one step past its start."""
    service = server.client()
    trainer = service.create_lora_training_client(base_model=BASE, rank=2).result()
    trainer.forward_backward(ROWS, "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=0.1)).result()
    return service, trainer


def test_ten_steps_loss_falls_and_outputs_round_trip(server, fake, monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "1")  # the SDK's telemetry is accepted and dropped
    service = server.client()
    trainer = service.create_lora_training_client(base_model=BASE, rank=4).result()
    info = trainer.get_info()
    assert info.model_id.endswith(":train:0") and info.lora_rank == 4 and info.model_data.model_name == BASE
    assert trainer.get_tokenizer().eos_token == "</s>"  # the base's tokenizer, read from its directory
    losses = []
    for _ in range(10):
        fb = trainer.forward_backward(ROWS, "cross_entropy")
        step = trainer.optim_step(types.AdamParams(learning_rate=0.05))
        out, metrics = fb.result(), step.result().metrics
        engine_out = fake.returned[-1][1]
        assert out.metrics == engine_out.metrics  # what the SDK reads is what the engine returned
        for got, want in zip(out.loss_fn_outputs, engine_out.outputs, strict=True):
            np.testing.assert_array_equal(got["logprobs"].to_numpy(), want["logprobs"])
            np.testing.assert_array_equal(got["elementwise_loss"].to_numpy(), want["elementwise_loss"])
        assert metrics["grad_norm:mean"] > 0
        losses.append(out.metrics["loss:sum"])
    assert losses[-1] < losses[0] and all(b < a for a, b in zip(losses, losses[1:]))
    assert [c for c, _ in fake.log] == ["forward_backward", "optim_step"] * 10
    service.close("success").result()


def test_sample_from_saved_weights_with_logprobs(server, fake):
    service, trainer = trained_client(server)
    path = trainer.save_weights_for_sampler("snap").result().path
    assert path == f"tinker://{trainer.model_id}/sampler_weights/snap"
    sampler = service.create_sampling_client(model_path=path).result()
    params = types.SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=10, stop=["xyz"])
    result = sampler.sample(types.ModelInput.from_ints([3, 4, 5]), 3, params, include_prompt_logprobs=True).result()
    engine_out = fake.returned[-1][1]
    assert fake.last_sample == ([3, 4, 5], 3, SampleSpec(max_tokens=5, temperature=0.7, top_p=0.9, top_k=10,
                                                         stop_strings=("xyz",)), True)
    assert len(result.sequences) == 3 and len({s.sequence_id for s in result.sequences}) == 3
    for got, want in zip(result.sequences, engine_out.sequences, strict=True):
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
        np.testing.assert_array_equal(np.float32(got.logprobs), np.float32(want.logprobs))
    assert result.prompt_logprobs[0] is None
    np.testing.assert_array_equal(np.float32(result.prompt_logprobs[1:]), np.float32(engine_out.prompt_logprobs[1:]))
    # the engine sampled the saved weights, not the base
    assert fake.returned[-1][0] == f"{trainer.model_id}/sampler_weights/snap"
    again = trainer.save_weights_and_get_sampling_client().result()
    stop_ids = types.SamplingParams(max_tokens=2, seed=7, stop=[9, 10])
    assert again.sample(types.ModelInput.from_ints([1]), 1, stop_ids).result().sequences[0].tokens
    assert fake.last_sample[2] == SampleSpec(max_tokens=2, seed=7, stop_tokens=(9, 10))
    base = service.create_sampling_client(base_model=BASE).result()
    assert base.compute_logprobs(types.ModelInput.from_ints([1, 2, 3])).result()[0] is None


def test_save_state_then_load_in_a_new_client(server, fake):
    service, trainer = trained_client(server)
    path = trainer.save_state("ckpt").result().path
    assert path == f"tinker://{trainer.model_id}/weights/ckpt"
    w_saved = fake.w[trainer.model_id]
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert fake.w[resumed.model_id] == w_saved and resumed.model_id != trainer.model_id
    a = trainer.forward(ROWS, "cross_entropy").result().metrics["loss:sum"]
    b = resumed.forward(ROWS, "cross_entropy").result().metrics["loss:sum"]
    assert a == b


def test_a_new_server_resumes_from_saved_state(tokenizer_dir, tmp_path):
    from tests.tinker.conftest import live_tinker
    from tests.tinker.fake_engine import FakeEngine

    with live_tinker(FakeEngine(tokenizer_dir, tmp_path)) as first:
        trainer = first.client().create_lora_training_client(base_model=BASE, rank=3, seed=5).result()
        trainer.forward_backward(ROWS, "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=0.1)).result()
        path = trainer.save_state("resume").result().path
        sampler_path = trainer.save_weights_for_sampler("s").result().path
        want = trainer.forward(ROWS, "cross_entropy").result().metrics["loss:sum"]
    with live_tinker(FakeEngine(tokenizer_dir, tmp_path)) as second:
        service = second.client()
        resumed = service.create_training_client_from_state_with_optimizer(path).result()
        assert resumed.get_info().lora_rank == 3 and resumed.get_info().model_data.model_name == BASE
        assert resumed.forward(ROWS, "cross_entropy").result().metrics["loss:sum"] == want
        sampler = service.create_sampling_client(model_path=sampler_path).result()
        assert sampler.get_base_model() == BASE
        with pytest.raises(Exception, match="no such checkpoint on this server"):
            service.create_training_client_from_state(path.replace("resume", "other")).result()


def test_custom_loss_runs_through_forward_and_cross_entropy(server, fake):
    import torch

    trainer = server.client().create_lora_training_client(base_model=BASE, rank=2).result()

    def neg_mean_logprob(data, logprobs_list):
        loss = -torch.stack([lp.mean() for lp in logprobs_list]).sum()
        return loss, {"custom:sum": float(loss.detach())}

    out = trainer.forward_backward_custom(ROWS, neg_mean_logprob).result()
    assert out.metrics["custom:sum"] == pytest.approx(out.metrics["loss:sum"])
    assert [c for c, _ in fake.log] == ["forward", "forward_backward"]
    assert fake.grad[trainer.model_id] != 0


def test_a_pickled_sampling_client_joins_its_session(server, fake):
    import pickle

    service = server.client()
    trainer = service.create_lora_training_client(base_model=BASE, rank=2).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    clone = pickle.loads(pickle.dumps(sampler))
    params = types.SamplingParams(max_tokens=3)
    a = sampler.sample(types.ModelInput.from_ints([5]), 1, params).result()
    b = clone.sample(types.ModelInput.from_ints([5]), 1, params).result()
    assert a.sequences[0].tokens == b.sequences[0].tokens
    assert a.sequences[0].sequence_id != b.sequences[0].sequence_id


def test_closing_a_session_unloads_its_models(server, fake):
    import httpx

    service = server.client()
    trainer = service.create_lora_training_client(base_model=BASE, rank=2).result()
    session = trainer.model_id.split(":")[0]
    service.close("success").result()
    with httpx.Client(base_url=server.base_url, headers={"X-API-Key": "tml-test-key"}) as http:
        for _ in range(100):
            if trainer.model_id not in fake.w:
                break
            time.sleep(0.05)
        assert trainer.model_id not in fake.w
        assert http.post("/api/v1/session_heartbeat", json={"session_id": session}).status_code == 410
        assert http.post("/api/v1/get_info", json={"model_id": trainer.model_id}).status_code == 404
