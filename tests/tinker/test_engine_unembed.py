"""``train_unembed``: a LoRA on the LM head that the chunked head honours. Its forward and
its gradients equal peft's LoRA on the Hugging Face model's ``lm_head``, loaded from the
adapter the engine saved for sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai_core.tinker.engine_types import AdamSpec, LoraSpec
from tests.tinker.conftest import BASE, sft_datums

peft = pytest.importorskip("peft")


def _trained(make_engine, spec: LoraSpec, steps: int = 3):
    engine = make_engine()
    engine.create_model("m", BASE, spec)
    datums, _, _ = sft_datums()
    for _ in range(steps):
        engine.forward_backward("m", datums, "cross_entropy")
        engine.optim_step("m", AdamSpec(learning_rate=2e-2))
    return engine


def _peft_model(engine, hf_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    key = engine.save_weights("m", "s", for_sampler=True)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    return PeftModel.from_pretrained(model, str(tmp_path / "state" / key / "adapter"),
                                     is_trainable=True)


def _peft_logprobs(model, datums) -> list[torch.Tensor]:
    out = []
    for datum in datums:
        logits = model(torch.tensor([datum.tokens])).logits[0].float()
        targets = torch.as_tensor(datum.loss_fn_inputs["target_tokens"])
        out.append(torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0])
    return out


@pytest.mark.parametrize("attn_mlp", [True, False], ids=["with-layers", "head-only"])
def test_the_unembedding_lora_is_peft_lm_head_lora(make_engine, hf_dir, tmp_path, attn_mlp):
    spec = LoraSpec(rank=4, seed=5, train_attn=attn_mlp, train_mlp=attn_mlp, train_unembed=True)
    engine = _trained(make_engine, spec)
    tenant = engine.tenants["m"]
    head = {n: p for n, p in tenant.parameters().items() if n.startswith("tinker_unembed.")}
    assert len(head) == 2 and bool(torch.any(head[f"tinker_unembed.lora_B.{tenant.slot}.weight"] != 0))
    assert (len(tenant.parameters()) > 2) == attn_mlp

    model = _peft_model(engine, hf_dir, tmp_path)
    assert any("lm_head.lora_B" in n for n, _ in model.named_parameters())
    datums, _, _ = sft_datums(seed=4)
    ours = engine.forward_backward("m", datums, "cross_entropy")
    theirs = _peft_logprobs(model, datums)
    for out, ref in zip(ours.outputs, theirs, strict=True):
        np.testing.assert_allclose(out["logprobs"], ref.detach().numpy(), atol=1e-5)
    loss = sum(-(ref * torch.as_tensor(d.loss_fn_inputs["weights"])).sum()
               for ref, d in zip(theirs, datums, strict=True))
    loss.backward()
    grads = dict(model.named_parameters())
    for kind in ("lora_A", "lora_B"):
        want = grads[f"base_model.model.lm_head.{kind}.default.weight"].grad
        got = head[f"tinker_unembed.{kind}.{tenant.slot}.weight"].grad
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_unembedding_lora_changes_the_output_and_sampling(make_engine):
    """Zeroing the head adapter's B (its update) changes the logprobs: it is in effect in
    forward and in sampling, and a tenant without it has no head tensors."""
    from astrai_core.tinker.engine_types import SamplerTarget, SampleSpec

    engine = _trained(make_engine, LoraSpec(rank=4, seed=5, train_attn=False, train_mlp=False))
    datums, _, _ = sft_datums(seed=4)
    before = engine.forward("m", datums, "cross_entropy").outputs[0]["logprobs"]
    key = engine.save_weights("m", "s", for_sampler=True)
    greedy = SampleSpec(max_tokens=6, temperature=0.0)
    tuned = engine.sample(SamplerTarget(BASE, key), [1, 7, 9], 1, greedy).sequences[0]
    bare = engine.sample(SamplerTarget(BASE), [1, 7, 9], 1, greedy).sequences[0]
    assert tuned.logprobs != bare.logprobs
    tenant = engine.tenants["m"]
    with torch.no_grad():
        tenant.parameters()[f"tinker_unembed.lora_B.{tenant.slot}.weight"].zero_()
    after = engine.forward("m", datums, "cross_entropy").outputs[0]["logprobs"]
    assert not np.allclose(before, after, atol=1e-4)

    engine.create_model("plain", BASE, LoraSpec(rank=4, seed=5, train_unembed=False))
    assert not any("tinker_unembed" in n for n in engine.tenants["plain"].parameters())
