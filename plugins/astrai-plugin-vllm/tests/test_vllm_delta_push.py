"""``push: delta`` on the vllm sampler: after every push of a bf16 policy trained at a small
learning rate the engine's copy of the pushed state equals the trainer's Hugging Face
tensors bit for bit and the engine generates exactly what a fully pushed engine does,
while far fewer bytes travel; a corrupted delta (safetensors bytes into an engine core in
its own process) stops the push with one line naming the tensor, and the next push is
whole."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from astrai_core.api import (PER_EXPERT, WeightPushMismatch, load_importer,  # noqa: E402
                             process_registry)
from astrai_core.sampling import SamplingParams  # noqa: E402
from astrai_plugin_vllm import delta as delta_module  # noqa: E402
from astrai_plugin_vllm.sampler import VllmSampler  # noqa: E402
from astrai_plugin_vllm.weights import hf_weights  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
PROMPTS = [[5, 9, 12, 40, 3], [7, 3, 88], [100, 4, 4, 17, 60, 2, 9]]
LR = 1e-4  # the tiny model's weights are ~0.3: most bf16 values do not move in a step
VOCAB = 128


@pytest.fixture(scope="module")
def policy(tiny_models):
    torch.manual_seed(0)
    return tiny_models[("dense", 0)].native().to(torch.bfloat16)


@pytest.fixture(scope="module")
def engines(policy, helpers):
    """(fully pushed engine, delta-pushed engine), in this process and on one policy;
    closed together (closing an in-process engine tears down the process's vLLM groups)."""
    full = VllmSampler(policy, **helpers.engine_options)
    delta = VllmSampler(policy, push="delta", **helpers.engine_options)
    yield full, delta
    delta.close()
    full.close()


@pytest.fixture(scope="module")
def full_engine(engines):
    return engines[0]


def _train_step(model, optimizer, step: int) -> None:
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(step))
    logits = model(ids)["logits"][:, :-1].reshape(-1, VOCAB).float()
    loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _push(sampler) -> dict[str, float]:
    sampler.update_weights()
    return sampler.metrics()


def _read_mirror(worker) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in worker._astrai_delta_mirror.tensors.items()}


def _assert_same_generation(sampler, reference) -> list[list[float]]:
    ours, expected = sampler.generate(PROMPTS, GREEDY), reference.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in ours] == [c.token_ids for c in expected]
    assert [c.logprobs for c in ours] == [c.logprobs for c in expected]  # exactly
    return [c.logprobs for c in ours]


def test_delta_pushes_equal_full_pushes_bit_for_bit_with_fewer_bytes(policy, engines):
    full_engine, sampler = engines
    importer = load_importer(process_registry(), model_type="qwen3")
    before = _assert_same_generation(sampler, full_engine)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR)
    for step in range(3):
        _train_step(policy, optimizer, step)
        metrics, full = _push(sampler), _push(full_engine)
        sent, whole = metrics["rollout/weight_push_mb"], metrics["rollout/weight_push_full_mb"]
        assert whole == full["rollout/weight_push_mb"] > 0
        if step == 0:  # nothing to compare against yet: the whole state
            assert sent == whole
        else:
            assert 0 < sent < whole / 4, (step, sent, whole)
        expected = hf_weights(importer, policy, PER_EXPERT)
        (mirror,) = sampler.engine.collective_rpc(_read_mirror)
        assert sorted(mirror) == sorted(expected)
        for name, value in expected.items():  # bit for bit, read as integers
            assert torch.equal(mirror[name].view(torch.int16), value.view(torch.int16)), name
        sampler.verify_weights()
        after = _assert_same_generation(sampler, full_engine)
    assert after != before  # the pushes changed what the engine computes


def test_a_corrupted_delta_stops_the_push_and_the_next_push_is_whole(policy, full_engine,
                                                                    helpers, monkeypatch):
    sampler = VllmSampler(policy, push="delta", multiprocess=True, **helpers.engine_options)
    try:
        optimizer = torch.optim.AdamW(policy.parameters(), lr=LR)
        _push(sampler)
        _train_step(policy, optimizer, 10)
        wire = delta_module.to_wire

        def corrupt(payload, multiprocess):
            data = bytearray(wire(payload, multiprocess))
            data[-1] ^= 0x20  # the last byte: the last tensor's values
            return bytes(data)

        monkeypatch.setattr(delta_module, "to_wire", corrupt)
        with pytest.raises(WeightPushMismatch) as caught:
            sampler.update_weights()
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith("the vLLM engine: weight push bucket ")
        assert "tensor '" in message and "does not match the trainer's" in message
        with pytest.raises(WeightPushMismatch, match="holds other weights than the trainer"):
            sampler.verify_weights()  # the engine's copy is gone
        monkeypatch.setattr(delta_module, "to_wire", wire)
        metrics = _push(sampler)  # after a failed push the next one is whole
        assert metrics["rollout/weight_push_mb"] == metrics["rollout/weight_push_full_mb"]
        sampler.verify_weights()
        _push(full_engine)
        _assert_same_generation(sampler, full_engine)
    finally:
        sampler.close()


def test_verify_weights_needs_delta_pushes(full_engine):
    from astrai_core.api import ConfigError

    with pytest.raises(ConfigError, match="sampler.push: .*only push: delta keeps"):
        full_engine.verify_weights()
