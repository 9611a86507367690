"""forward_backward + optim_step: the cross_entropy loss is astrai's SFT loss, the
policy losses are Tinker's definitions and astrai's own, and training lowers the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai_core.model.head import target_logprobs
from astrai_core.model.lora import inject_lora, peft_lora_config
from astrai_core.rl.policy_losses import CISPO, PPOClip
from astrai_core.strategies.language_modeling import next_token_loss
from astrai_core.tinker.adapters import LORA_ALPHA
from astrai_core.tinker.bases import load_base
from astrai_core.tinker.engine_types import AdamSpec, DatumIn, EngineRequestError, LoraSpec
from tests.tinker.conftest import BASE, policy_datums, sft_datums

ADAM = AdamSpec(learning_rate=5e-3)
# Tests against reference_model: astrai's LoRA there has no unembedding adapter (peft's
# is the reference of that one, in test_engine_unembed.py).
NO_UNEMBED = {"train_unembed": False}


def reference_model(engine, model_id: str, hf_dir, tmp_path):
    """A separate copy of the base with astrai's own LoRA holding the tenant's adapter."""
    model = load_base("ref", str(hf_dir), cache_dir=str(tmp_path / "imports")).model
    tenant = engine.tenants[model_id]
    inject_lora(model, peft_lora_config(r=tenant.spec.rank, alpha=LORA_ALPHA, dropout=0.0,
                                        target_modules=engine.bases[BASE].slots.configs[
                                            tenant.slot].target_modules,
                                        use_rslora=False, use_dora=False))
    state = tenant.adapter_state()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(state[name])
    return model.eval()


def sft_loss(model, rows, masks) -> tuple[float, int]:
    """astrai's SFT loss (mean over targets, the sft strategy's computation) and the count."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros(len(rows), width)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, :len(row)] = torch.as_tensor(row)
        attention[i, :len(row)] = 1
        loss_mask[i, :len(row)] = torch.as_tensor(mask)
    with torch.no_grad():
        out = target_logprobs(model, ids, ids[:, 1:], attention_mask=attention)
        loss, count = next_token_loss(out["logprobs"], loss_mask)
    return float(loss), int(count)


def test_cross_entropy_step_loss_is_astrais_sft_loss(make_engine, hf_dir, tmp_path):
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=3, **NO_UNEMBED))
    datums, rows, masks = sft_datums()
    for step in range(3):
        reference, count = sft_loss(reference_model(engine, "m", hf_dir, tmp_path), rows, masks)
        out = engine.forward_backward("m", datums, "cross_entropy")
        assert out.metrics["loss:sum"] / count == pytest.approx(reference, abs=1e-5), step
        elementwise = np.concatenate([o["elementwise_loss"] for o in out.outputs])
        assert elementwise.sum() == pytest.approx(out.metrics["loss:sum"], rel=1e-6)
        for output, datum in zip(out.outputs, datums):
            assert output["logprobs"].dtype == np.float32
            assert output["logprobs"].shape == (len(datum.tokens),)
            weights = datum.loss_fn_inputs["weights"]
            np.testing.assert_allclose(output["elementwise_loss"],
                                       -output["logprobs"] * weights, atol=1e-6)
        engine.optim_step("m", ADAM)


def test_ten_steps_lower_the_loss(make_engine):
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=8, seed=0))
    datums, _, _ = sft_datums()
    losses = []
    for _ in range(10):
        losses.append(engine.forward_backward("m", datums, "cross_entropy").metrics["loss:sum"])
        metrics = engine.optim_step("m", ADAM)
        assert metrics["grad_norm:mean"] > 0
    assert losses[-1] < 0.8 * losses[0], losses


def test_gradients_add_up_over_calls_until_the_step(make_engine):
    """Two forward_backward calls then one step == one call on both halves (Tinker's
    accumulation), and forward alone leaves no gradient."""
    datums, _, _ = sft_datums()
    split, joined = make_engine(), make_engine()
    for engine in (split, joined):
        engine.create_model("m", BASE, LoraSpec(rank=4, seed=1))
    split.forward("m", datums, "cross_entropy")
    split.forward_backward("m", datums[:1], "cross_entropy")
    split.forward_backward("m", datums[1:], "cross_entropy")
    joined.forward_backward("m", datums, "cross_entropy")
    for engine in (split, joined):
        engine.optim_step("m", AdamSpec(learning_rate=1e-2, grad_clip_norm=1.0))
    a, b = split.tenants["m"].adapter_state(), joined.tenants["m"].adapter_state()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def _policy_inputs(datums, outputs):
    pad = max(len(d.tokens) for d in datums)

    def stack(key=None, source=None):
        out = torch.zeros(len(datums), pad)
        for i, datum in enumerate(datums):
            value = source[i]["logprobs"] if source else datum.loss_fn_inputs[key]
            out[i, :len(datum.tokens)] = torch.as_tensor(value)
        return out

    mask = torch.zeros(len(datums), pad, dtype=torch.bool)
    for i, datum in enumerate(datums):
        mask[i, :len(datum.tokens)] = True
    return stack(source=outputs), stack("logprobs"), stack("advantages"), mask


@pytest.mark.parametrize("config", [None, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}])
def test_policy_losses_are_tinkers_and_astrais(make_engine, config):
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=2))
    datums, _, _ = sft_datums()
    engine.forward_backward("m", datums, "cross_entropy")
    engine.optim_step("m", AdamSpec(learning_rate=2e-2))  # a nonzero adapter
    data = policy_datums()
    logp, q, adv, mask = _policy_inputs(data, engine.forward("m", data, "importance_sampling").outputs)
    low, high = (0.8, 1.2) if config is None else (0.9, 1.05)
    ratio = torch.exp(logp - q)
    hand = {  # Tinker's documented definitions
        "importance_sampling": -(ratio * adv),
        "ppo": -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv),
        "cispo": -(ratio.clamp(low, high) * logp * adv),
    }
    astrai = {
        "ppo": PPOClip(1 - low, high - 1)(logprobs=logp, old_logprobs=q, advantages=adv,
                                         response_mask=mask)[0],
        "cispo": CISPO(1 - low, high - 1)(logprobs=logp, old_logprobs=q, advantages=adv,
                                         response_mask=mask)[0],
    }
    assert (ratio[mask] < low).any() or (ratio[mask] > high).any()  # clipping matters here
    for loss_fn, per_token in hand.items():
        given = None if loss_fn == "importance_sampling" else config
        out = engine.forward_backward("m", data, loss_fn, given)
        got = torch.zeros_like(logp)
        for i, o in enumerate(out.outputs):
            got[i, :len(o["elementwise_loss"])] = torch.as_tensor(o["elementwise_loss"])
        expected = torch.where(mask, per_token, 0.0)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        assert out.metrics["loss:sum"] == pytest.approx(float(expected.sum()), abs=1e-5)
        if loss_fn in astrai:
            torch.testing.assert_close(got, astrai[loss_fn], rtol=0, atol=1e-6)


def test_dro_is_tinkers_definition(make_engine):
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=2))
    data = policy_datums()
    out = engine.forward("m", data, "dro", {"beta": 0.3})
    for datum, o in zip(data, out.outputs):
        logp, q = o["logprobs"], datum.loss_fn_inputs["logprobs"]
        expected = -(logp * datum.loss_fn_inputs["advantages"] - 0.15 * (logp - q) ** 2)
        np.testing.assert_allclose(o["elementwise_loss"], expected, atol=1e-6)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_policy_loss_gradients_are_those_of_the_definition(make_engine, hf_dir, tmp_path, loss_fn):
    """The adapter's gradient after forward_backward is autograd's of Tinker's formula on
    a separate model with astrai's LoRA holding the same adapter."""
    engine, reference = _stepped_with_reference(make_engine, hf_dir, tmp_path)
    data = policy_datums()
    engine.forward_backward("m", data, loss_fn)

    logp = _reference_logprobs(reference, data)
    _, q, adv, mask = _policy_inputs(data, [{"logprobs": np.zeros(len(d.tokens))} for d in data])
    ratio = torch.exp(torch.where(mask, logp - q, 0.0))
    objective = {"importance_sampling": ratio * adv,
                 "ppo": torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv),
                 "cispo": ratio.clamp(0.8, 1.2).detach() * logp * adv}[loss_fn]
    (-torch.where(mask, objective, 0.0).sum()).backward()
    _assert_same_grads(engine, reference)


def _stepped_with_reference(make_engine, hf_dir, tmp_path):
    """An engine whose tenant "m" took one step (a nonzero adapter), and a reference model
    holding that adapter."""
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=2, **NO_UNEMBED))
    datums, _, _ = sft_datums()
    engine.forward_backward("m", datums, "cross_entropy")
    engine.optim_step("m", AdamSpec(learning_rate=2e-2))
    return engine, reference_model(engine, "m", hf_dir, tmp_path)


def _reference_logprobs(reference, data: list[DatumIn]) -> torch.Tensor:
    """[B, T] target log-probs of right-padded ``data`` on the reference model."""
    pad = max(len(d.tokens) for d in data)
    ids = torch.zeros(len(data), pad + 1, dtype=torch.long)
    targets = torch.zeros(len(data), pad, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, d in enumerate(data):
        ids[i, :len(d.tokens)] = torch.as_tensor(d.tokens)
        targets[i, :len(d.tokens)] = torch.as_tensor(d.loss_fn_inputs["target_tokens"])
        attention[i, :len(d.tokens)] = 1
    return target_logprobs(reference, ids, targets, attention_mask=attention)["logprobs"]


def _assert_same_grads(engine, reference) -> None:
    tenant = engine.tenants["m"]
    grads = {name.replace(f".{tenant.slot}.", ".default."): p.grad
             for name, p in tenant.parameters().items()}
    for name, param in reference.named_parameters():
        if "lora_" in name:
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo"])
def test_per_token_clip_thresholds(make_engine, loss_fn):
    """Thresholds given per token in loss_fn_inputs clip each token at its own range."""
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=2))
    data = policy_datums()
    rng = np.random.default_rng(5)
    lows = [rng.uniform(0.7, 1.0, len(d.tokens)).astype(np.float32) for d in data]
    highs = [rng.uniform(1.0, 1.3, len(d.tokens)).astype(np.float32) for d in data]
    clipped = [DatumIn(d.tokens, {**d.loss_fn_inputs, "clip_low_threshold": lo,
                                  "clip_high_threshold": hi})
               for d, lo, hi in zip(data, lows, highs)]
    out = engine.forward("m", clipped, loss_fn)
    for datum, o, lo, hi in zip(data, out.outputs, lows, highs):
        logp = torch.as_tensor(o["logprobs"])
        q = torch.as_tensor(datum.loss_fn_inputs["logprobs"])
        adv = torch.as_tensor(datum.loss_fn_inputs["advantages"])
        ratio = torch.exp(logp - q)
        bounded = torch.clamp(ratio, torch.as_tensor(lo), torch.as_tensor(hi))
        expected = (-torch.minimum(ratio * adv, bounded * adv) if loss_fn == "ppo"
                    else -(bounded * logp * adv))
        np.testing.assert_allclose(o["elementwise_loss"], expected.numpy(), atol=1e-6)
    with pytest.raises(EngineRequestError, match="given in 1 of 2 datums"):
        engine.forward("m", [clipped[0], data[1]], loss_fn)


def _gspo_datums() -> list[DatumIn]:
    """Policy datums whose first tokens are a prompt outside the sequence ratio."""
    data = policy_datums()
    out = []
    for datum in data:
        marks = np.ones(len(datum.tokens), dtype=np.float32)
        marks[:2] = 0.0
        out.append(DatumIn(datum.tokens, {**datum.loss_fn_inputs, "sequence_ratio_mask": marks}))
    return out


def test_gspo_is_tinkers_definition(make_engine, hf_dir, tmp_path):
    """GSPO-token, written per datum as Tinker documents it: the loss and the adapter's
    gradient equal autograd's on a separate model holding the same adapter."""
    engine, reference = _stepped_with_reference(make_engine, hf_dir, tmp_path)
    data = _gspo_datums()
    out = engine.forward_backward("m", data, "gspo", {"clip_low_threshold": 0.85,
                                                      "clip_high_threshold": 1.2})
    logp = _reference_logprobs(reference, data)
    total, clipped = torch.zeros(()), []
    for i, datum in enumerate(data):
        length = len(datum.tokens)
        target = logp[i, :length]
        q = torch.as_tensor(datum.loss_fn_inputs["logprobs"])
        adv = torch.as_tensor(datum.loss_fn_inputs["advantages"])
        in_ratio = torch.as_tensor(datum.loss_fn_inputs["sequence_ratio_mask"]) != 0
        log_ratio = (target.detach() - q)[in_ratio].mean()
        ratio = torch.exp(log_ratio + target - target.detach())
        clipped.append(not 0.85 <= float(ratio[0].detach()) <= 1.2)
        per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.85, 1.2) * adv)
        np.testing.assert_allclose(out.outputs[i]["elementwise_loss"], per_token.detach().numpy(),
                                   atol=1e-5)
        total = total + per_token.sum()
    assert out.metrics["loss:sum"] == pytest.approx(float(total.detach()), abs=1e-4)
    assert clipped == [True, False]  # one sequence clipped, one not: both branches matter
    total.backward()
    _assert_same_grads(engine, reference)


def test_gspo_refuses_a_sequence_ratio_mask_that_marks_nothing(make_engine):
    engine = make_engine()
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=2))
    data = _gspo_datums()
    empty = DatumIn(data[1].tokens, {**data[1].loss_fn_inputs,
                                     "sequence_ratio_mask": np.zeros(len(data[1].tokens), np.float32)})
    with pytest.raises(EngineRequestError, match="datum 1: .*sequence_ratio_mask.* marks no token"):
        engine.forward("m", [data[0], empty], "gspo")
    with pytest.raises(EngineRequestError, match="no 'sequence_ratio_mask'"):
        engine.forward("m", policy_datums(), "gspo")
