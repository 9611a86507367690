"""``push: delta`` on the ray sampler: after every push of a bf16 policy trained at a
small learning rate the workers hold the trainer's weights bit for bit, fewer bytes
travel than a full push would send, and a corrupted bucket stops the push with one line
naming the worker and tensor."""

from __future__ import annotations

import pytest
import torch

from astrai_core.api import CausalLM, ModelConfig, WeightPushMismatch
from astrai_core.testing import TINY_MODEL
from astrai_plugin_ray import push as push_module
from astrai_plugin_ray.sampler import RaySampler


def _bf16_model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(vocab_size=64, **TINY_MODEL)).to(torch.bfloat16)


def _train_step(model: CausalLM, optimizer: torch.optim.Optimizer, step: int) -> None:
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(step))
    logits = model(ids)["logits"][:, :-1].reshape(-1, 64).float()
    loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _assert_workers_hold(sampler: RaySampler) -> None:
    expected = sampler.model.state_dict()
    for weights in sampler.worker_weights():
        for name, value in expected.items():  # bit for bit, read as integers
            assert torch.equal(weights[name].view(torch.int16), value.view(torch.int16)), name
    sampler.verify_weights()


@pytest.fixture
def delta_sampler(ray_session, request):
    sampler = RaySampler(model=_bf16_model(), workers=2, worker_resources={"CPU": 0.5},
                         weight_transport=request.param, bucket_mb=0.01, push="delta")
    yield sampler
    sampler.close()


@pytest.mark.parametrize("delta_sampler", ["collective", "object_store"], indirect=True)
def test_delta_pushes_are_bit_exact_and_smaller(delta_sampler):
    model = delta_sampler.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(3):
        _train_step(model, optimizer, step)
        delta_sampler.update_weights()
        metrics = delta_sampler.metrics()
        sent, full = metrics["rollout/weight_push_mb"], metrics["rollout/weight_push_full_mb"]
        if step == 0:  # the first push has nothing to compare against: whole
            assert sent >= full
        else:
            assert 0 < sent < full / 2, (step, sent, full)
        _assert_workers_hold(delta_sampler)


@pytest.mark.parametrize("delta_sampler", ["collective"], indirect=True)
def test_a_corrupted_bucket_stops_the_push_and_the_next_push_is_whole(delta_sampler,
                                                                     monkeypatch):
    model = delta_sampler.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    _train_step(model, optimizer, 0)
    delta_sampler.update_weights()
    _train_step(model, optimizer, 1)
    packed = push_module.pack

    def corrupt(bucket, tensors, device):
        buffer = packed(bucket, tensors, device)
        buffer[-1] ^= 0x20  # the last byte: the last tensor's values
        return buffer

    monkeypatch.setattr(push_module, "pack", corrupt)
    with pytest.raises(WeightPushMismatch) as caught:
        delta_sampler.update_weights()
    message = str(caught.value)
    assert "\n" not in message
    assert "rollout worker" in message and "weight push bucket" in message and "tensor '" in message
    with pytest.raises(WeightPushMismatch, match="holds other weights than the trainer"):
        delta_sampler.verify_weights()  # the whole-state check sees it too
    monkeypatch.setattr(push_module, "pack", packed)
    delta_sampler.update_weights()  # after a failed push the next one is whole
    metrics = delta_sampler.metrics()
    assert metrics["rollout/weight_push_mb"] >= metrics["rollout/weight_push_full_mb"]
    _assert_workers_hold(delta_sampler)
