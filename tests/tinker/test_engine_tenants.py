"""Tenants on one base: a tenant's outputs do not change, bit for bit, when another one
trains and samples in between; saved weights continue training bit for bit."""

from __future__ import annotations

import numpy as np
import torch

from astrai_core.tinker.engine_types import AdamSpec, LoraSpec, SamplerTarget, SampleSpec
from tests.tinker.conftest import BASE, policy_datums, sft_datums

ADAM = AdamSpec(learning_rate=5e-3, weight_decay=0.01)


def _record(engine, model_id, datums, steps, other=None):
    """Per step: the loss, the forward outputs, a sample from saved sampler weights;
    ``other``: a second tenant that trains (another loss) and samples between the steps."""
    seen = []
    for step in range(steps):
        out = engine.forward_backward(model_id, datums, "cross_entropy")
        if other is not None:
            engine.forward_backward(other, policy_datums(), "ppo")
            engine.optim_step(other, AdamSpec(learning_rate=3e-2))
            engine.sample(SamplerTarget(BASE, engine.save_weights(other, f"o{step}", for_sampler=True)),
                          [3, 4, 5], 2, SampleSpec(max_tokens=4, seed=step))
        engine.optim_step(model_id, ADAM)
        key = engine.save_weights(model_id, f"s{step}", for_sampler=True)
        sample = engine.sample(SamplerTarget(BASE, key), [1, 2, 3], 3,
                               SampleSpec(max_tokens=6, seed=7), prompt_logprobs=True)
        seen.append((out.metrics["loss:sum"], out.outputs, sample))
    return seen


def test_a_tenant_is_unaffected_by_another_bit_for_bit(make_engine, tmp_path):
    datums, _, _ = sft_datums()
    alone = make_engine(tmp_path / "alone")
    alone.create_model("a", BASE, LoraSpec(rank=4, seed=5))
    shared = make_engine(tmp_path / "shared")
    shared.create_model("b", BASE, LoraSpec(rank=8, seed=6))  # created first: another slot
    shared.create_model("a", BASE, LoraSpec(rank=4, seed=5))
    by_itself = _record(alone, "a", datums, 3)
    with_b = _record(shared, "a", datums, 3, other="b")
    for (loss1, out1, sample1), (loss2, out2, sample2) in zip(by_itself, with_b):
        assert loss1 == loss2
        for o1, o2 in zip(out1, out2):
            assert np.array_equal(o1["logprobs"], o2["logprobs"])
        assert sample1 == sample2
    a1, a2 = alone.tenants["a"].adapter_state(), shared.tenants["a"].adapter_state()
    assert all(torch.equal(a1[name], a2[name]) for name in a1)
    # and b did train: its adapter moved away from its start
    assert any(v.abs().sum() > 0 for n, v in shared.tenants["b"].adapter_state().items()
               if "lora_B" in n)


def test_save_then_load_in_a_new_engine_continues_bit_for_bit(make_engine, tmp_path):
    datums, _, _ = sft_datums()
    straight = make_engine(tmp_path / "straight")
    straight.create_model("m", BASE, LoraSpec(rank=4, seed=9))
    expected = [_step(straight, datums) for _ in range(5)]

    first = make_engine(tmp_path / "state")
    first.create_model("m", BASE, LoraSpec(rank=4, seed=9))
    got = [_step(first, datums) for _ in range(2)]
    key = first.save_weights("m", "ckpt", for_sampler=False)
    assert key == "m/weights/ckpt"
    assert (tmp_path / "state" / "m" / "weights" / "ckpt" / "manifest.json").is_file()

    second = make_engine(tmp_path / "state")
    second.create_model("m2", BASE, LoraSpec(rank=4, seed=123))  # another init: overwritten
    second.load_weights("m2", key, with_optimizer=True)
    got += [_step(second, datums, "m2") for _ in range(3)]
    assert got == expected
    a, b = straight.tenants["m"].adapter_state(), second.tenants["m2"].adapter_state()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_loading_without_the_optimizer_restarts_its_moments(make_engine, tmp_path):
    datums, _, _ = sft_datums()
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=9))
    _step(engine, datums)
    key = engine.save_weights("m", "w", for_sampler=False)
    fresh, warm = make_engine(), make_engine()
    for other in (fresh, warm):
        other.create_model("m", BASE, LoraSpec(rank=4, seed=1))
    fresh.load_weights("m", key, with_optimizer=False)
    warm.load_weights("m", key, with_optimizer=True)
    assert _step(fresh, datums) == _step(warm, datums)  # the same loss before the step
    assert _step(fresh, datums) != _step(warm, datums)  # different moments, different steps


def test_loading_weights_of_another_rank_reshapes_the_adapter(make_engine):
    datums, _, _ = sft_datums()
    engine = make_engine()
    engine.create_model("r8", BASE, LoraSpec(rank=8, seed=2))
    _step(engine, datums, "r8")
    key = engine.save_weights("r8", "w", for_sampler=False)
    engine.create_model("r2", BASE, LoraSpec(rank=2, seed=2))
    engine.load_weights("r2", key, with_optimizer=True)
    assert engine.tenants["r2"].spec.rank == 8
    assert _step(engine, datums, "r2") == _step(engine, datums, "r8")


def _step(engine, datums, model_id="m") -> float:
    loss = engine.forward_backward(model_id, datums, "cross_entropy").metrics["loss:sum"]
    engine.optim_step(model_id, ADAM)
    return loss
