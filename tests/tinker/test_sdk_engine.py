"""The official Tinker SDK against the server on the real torch engine and a tiny llama:
what the SDK reads equals what the engine computes when called directly."""

from __future__ import annotations

import threading

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")
from tinker import types  # noqa: E402

from astrai_core.tinker.engine_types import AdamSpec, LoraSpec  # noqa: E402
from tests.tinker.conftest import BASE, live_tinker, sft_datums  # noqa: E402


def _sdk_rows(seed: int = 0) -> list[types.Datum]:
    datums, _, _ = sft_datums(seed)
    return [types.Datum(model_input=types.ModelInput.from_ints(d.tokens),
                        loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"].tolist(),
                                        "weights": d.loss_fn_inputs["weights"].tolist()}) for d in datums]


def _logprobs(out) -> np.ndarray:
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def test_ten_steps_through_the_sdk_equal_the_engine_called_directly(make_engine, tmp_path):
    direct = make_engine(tmp_path / "direct")
    direct.create_model("direct:train:0", BASE, LoraSpec(rank=4, seed=3))
    datums, _, _ = sft_datums(0)
    with live_tinker(make_engine(tmp_path / "served")) as server:
        trainer = server.client().create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
        losses = []
        for _ in range(10):
            got = trainer.forward_backward(_sdk_rows(0), "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            want = direct.forward_backward("direct:train:0", datums, "cross_entropy")
            direct.optim_step("direct:train:0", AdamSpec(learning_rate=1e-2))
            assert got.metrics["loss:sum"] == want.metrics["loss:sum"]
            np.testing.assert_array_equal(_logprobs(got), np.concatenate([o["logprobs"] for o in want.outputs]))
            losses.append(got.metrics["loss:sum"])
    assert losses[-1] < losses[0]


def test_sampled_logprobs_equal_a_forward_pass(make_engine, tmp_path):
    with live_tinker(make_engine(tmp_path / "state")) as server:
        service = server.client()
        trainer = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
        trainer.forward_backward(_sdk_rows(0), "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        sampler = service.create_sampling_client(
            model_path=trainer.save_weights_for_sampler("s").result().path).result()
        prompt = [5, 9, 13, 2]
        result = sampler.sample(types.ModelInput.from_ints(prompt), 2,
                                types.SamplingParams(max_tokens=6, temperature=1.0, seed=4, stop=[]),
                                include_prompt_logprobs=True).result()
        for seq in result.sequences:
            row = prompt + seq.tokens
            fwd = trainer.forward([types.Datum(model_input=types.ModelInput.from_ints(row[:-1]),
                                               loss_fn_inputs={"target_tokens": row[1:], "weights": [1.0] * (len(row) - 1)})],
                                  "cross_entropy").result()
            scored = fwd.loss_fn_outputs[0]["logprobs"].to_numpy()
            np.testing.assert_allclose(seq.logprobs, scored[len(prompt) - 1:], atol=1e-5)
            np.testing.assert_allclose(result.prompt_logprobs[1:], scored[:len(prompt) - 1], atol=1e-5)


def test_two_tenants_on_one_base_are_unaffected_bit_for_bit(make_engine, tmp_path):
    def train(server, seed: int, out: dict) -> None:
        trainer = server.client().create_lora_training_client(base_model=BASE, rank=2, seed=seed).result()
        steps = []
        for _ in range(3):
            fb = trainer.forward_backward(_sdk_rows(seed), "cross_entropy")
            trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            steps.append(_logprobs(fb.result()))
        out[seed] = steps

    alone: dict = {}
    for seed in (1, 2):
        with live_tinker(make_engine(tmp_path / f"alone{seed}")) as server:
            train(server, seed, alone)
    together: dict = {}
    with live_tinker(make_engine(tmp_path / "together")) as server:
        threads = [threading.Thread(target=train, args=(server, seed, together)) for seed in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for seed in (1, 2):
        for a, b in zip(alone[seed], together[seed], strict=True):
            np.testing.assert_array_equal(a, b)


def test_save_state_then_load_state_in_a_new_server_continues_bit_for_bit(make_engine, tmp_path):
    state = tmp_path / "state"
    adam = types.AdamParams(learning_rate=1e-2)
    with live_tinker(make_engine(state)) as first:
        trainer = first.client().create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
        for _ in range(2):
            trainer.forward_backward(_sdk_rows(0), "cross_entropy").result()
            trainer.optim_step(adam).result()
        path = trainer.save_state("mid").result().path
        trainer.forward_backward(_sdk_rows(1), "cross_entropy").result()
        trainer.optim_step(adam).result()
        want = trainer.forward(_sdk_rows(0), "cross_entropy").result()
    with live_tinker(make_engine(state)) as second:
        resumed = second.client().create_training_client_from_state_with_optimizer(path).result()
        assert resumed.get_info().lora_rank == 4
        resumed.forward_backward(_sdk_rows(1), "cross_entropy").result()
        resumed.optim_step(adam).result()
        got = resumed.forward(_sdk_rows(0), "cross_entropy").result()
    assert got.metrics["loss:sum"] == want.metrics["loss:sum"]
    np.testing.assert_array_equal(_logprobs(got), _logprobs(want))
