"""LoRA runs: only the adapter trains (base bit-identical), the frozen reference is the
policy with its adapter disabled (no copy exists), PPO trains a full critic beside a LoRA
policy, --resume restores adapter and optimizer exactly, and bad options fail in the plan."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.checkpoints.lora_files import ADAPTER_DIR, ADAPTER_WEIGHTS, BASE_RECORD
from astrai_core.model.lora import DisabledAdapterReference, adapter_parameters, has_lora
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from tests.training.reference import run, save_start_model, text_run_config, write_texts

LORA = {"r": 4, "alpha": 8.0}


def lora_config(config, start, **lora):
    config["model"] = {"path": str(start), "lora": {**LORA, **lora}}
    return config


def write_pairs(path, count=8):
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(20), rng.randrange(10)
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{a}+{b}="}],
                                "chosen": str(a + b), "rejected": str(a + b + 3)}) + "\n")
    return path


def one_step(strategy, run_components):
    from astrai_core.training.trainer import Trainer

    trainer = Trainer(run_components, strategy)
    return trainer, trainer._train_step()


def test_a_step_changes_only_the_adapter_and_the_base_stays_bit_identical(tmp_path):
    start = save_start_model(tmp_path / "start")
    config = lora_config(text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start),
                         start)
    strategy, ctx = build_strategy(config, tmp_path)
    model = ctx.model
    before = {name: t.clone() for name, t in model.state_dict().items()}
    trainer, metrics = one_step(strategy, ctx)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    optimized = {id(p) for group in trainer.modules[0].optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in adapter_parameters(model).values()}
    changed = {name for name, t in model.state_dict().items() if not torch.equal(t, before[name])}
    assert changed and all("lora_" in name for name in changed)
    assert any(".lora_B." in name for name in changed)  # B starts at 0 and moved
    for name, tensor in model.state_dict().items():
        if "lora_" not in name:
            assert torch.equal(tensor, before[name]), name


def test_lora_resume_restores_adapter_and_optimizer_exactly(tmp_path):
    start = save_start_model(tmp_path / "start")
    data = write_texts(tmp_path / "docs.jsonl")

    def config(out, steps):
        cfg = text_run_config(tmp_path, data, start, out=out, max_steps=steps)
        cfg["trainer"].update(save_every=2)
        return lora_config(cfg, start)

    run(tmp_path, config("full", 4), "full.yaml")
    run(tmp_path, config("split", 2), "split.yaml")
    from astrai_core.config.loader import load_config
    from astrai_core.training.run import train

    (tmp_path / "resume.yaml").write_text(json.dumps(config("split", 4)))
    train(load_config(tmp_path / "resume.yaml"), resume=True)
    full = tmp_path / "full" / "checkpoints" / "step_4"
    split = tmp_path / "split" / "checkpoints" / "step_4"
    for step in (full, split):
        assert (step / BASE_RECORD).is_file() and not (step / "model.safetensors").exists()
    a = load_file(str(full / ADAPTER_DIR / ADAPTER_WEIGHTS))
    b = load_file(str(split / ADAPTER_DIR / ADAPTER_WEIGHTS))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [m["loss"] for m in read_metrics(tmp_path / "full")]
    assert [m["loss"] for m in read_metrics(tmp_path / "split")] == losses


def test_save_base_writes_the_base_and_from_scratch_always_does(tmp_path):
    start = save_start_model(tmp_path / "start")
    cfg = lora_config(text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                                      max_steps=1), start, save_base=True)
    run(tmp_path, cfg)
    step = tmp_path / "run" / "checkpoints" / "step_1"
    assert (step / "model.safetensors").is_file() and not (step / BASE_RECORD).exists()
    base = load_file(str(step / "model.safetensors"))
    assert not any("lora_" in k or "base_layer" in k for k in base)
    from astrai_core.checkpoints.native import load_pretrained

    assert has_lora(load_pretrained(step))


def _no_copy(strategy, ctx):
    """The reference is a weightless view of the policy: every parameter that exists
    belongs to the policy (or a critic), none to a reference."""
    reference = strategy.reference
    assert isinstance(reference, DisabledAdapterReference)
    assert reference.__dict__["policy"] is ctx.model
    assert list(reference.parameters()) == []
    for module in strategy.frozen_modules().values():
        assert list(module.parameters()) == []


def test_grpo_with_kl_uses_the_disabled_adapter_as_reference(tmp_path):
    from astrai_core.model import CausalLM
    from astrai_core.rollout.forward import policy_forward

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 4, "kl_coef": 0.1},
                             max_steps=2)
    config["model"]["lora"] = dict(LORA)
    strategy, ctx = build_strategy(config, tmp_path)
    _no_copy(strategy, ctx)
    base = CausalLM(ctx.model.config)
    from astrai_core.model.lora import base_state_dict

    base.load_state_dict(base_state_dict(ctx.model))
    with torch.no_grad():  # a non-trivial adapter, so policy and reference differ
        for param in adapter_parameters(ctx.model).values():
            param.normal_(0, 0.05)
    trainer, metrics = one_step(strategy, ctx)
    assert metrics["kl"] != 0.0 and torch.isfinite(torch.tensor(metrics["loss"]))
    rollout = strategy.batch_source().next_step()[0]
    ref = policy_forward(strategy.reference, rollout, ctx.logprob_temperature)["logprobs"]
    with torch.no_grad():
        expected = policy_forward(base.eval(), rollout, ctx.logprob_temperature)["logprobs"]
    assert torch.equal(ref, expected)


def test_dpo_with_lora_builds_no_reference_copy_and_trains(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    config = tiny_run_config(tmp_path, pairs, {"name": "dpo", "beta": 0.5},
                             data_format="preference", max_steps=2)
    config["model"]["lora"] = dict(LORA)
    strategy, ctx = build_strategy(config, tmp_path)
    _no_copy(strategy, ctx)
    _, metrics = one_step(strategy, ctx)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # at step 0 the adapter is zero: policy == reference, so the DPO loss is log 2
    assert metrics["loss"] == pytest.approx(0.6931471805599453, abs=1e-6)


def test_ppo_trains_a_full_critic_beside_a_lora_policy(tmp_path):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "ppo", "group_size": 2, "kl_coef": 0.05,
                                        "value_head_init_std": 0.1},
                             max_steps=1)
    config["advantage"] = {"name": "gae"}
    config["model"]["lora"] = dict(LORA)
    strategy, ctx = build_strategy(config, tmp_path)
    _no_copy(strategy, ctx)
    critic = strategy.critic
    assert not has_lora(critic.backbone)
    assert all(p.requires_grad for p in critic.parameters())
    policy_storage = {p.data_ptr() for p in ctx.model.parameters()}
    assert not policy_storage & {p.data_ptr() for p in critic.parameters()}
    before = {n: t.clone() for n, t in critic.state_dict().items()}
    trainer, metrics = one_step(strategy, ctx)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    critic_optimized = {id(p) for g in trainer.modules[1].optimizer.param_groups for p in g["params"]}
    assert critic_optimized == {id(p) for p in critic.parameters()}
    moved = [n for n, t in critic.state_dict().items() if not torch.equal(t, before[n])]
    assert any(n.startswith("backbone.layers.") for n in moved)  # the backbone itself trains


@pytest.mark.parametrize(("lora", "message"), [
    ({"target_modules": ["qproj"]}, r"model\.lora\.target_modules: .*unknown module 'qproj'"),
    ({"r": 0}, r"model\.lora\.r: "),
    ({"path": "nowhere"}, r"model\.lora\.path: .*adapter_config\.json not found"),
])
def test_bad_lora_options_fail_before_any_work_naming_the_field(tmp_path, lora, message):
    from astrai_core.config.loader import load_config
    from astrai_core.errors import ConfigError
    from astrai_core.training.run import prepare_run

    start = save_start_model(tmp_path / "start")
    cfg = lora_config(text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start),
                      start, **lora)
    (tmp_path / "bad.yaml").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=message):
        prepare_run(load_config(tmp_path / "bad.yaml"))


def write_sums(tmp_path, limit=5):
    """Every a+b (a, b < limit) as chat SFT rows, and the same prompts with their answer."""
    sums = [(a, b) for a in range(limit) for b in range(limit)]
    chat = tmp_path / "sft.jsonl"
    prompts = tmp_path / "eval.jsonl"
    chat.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"{a}+{b}="},
        {"role": "assistant", "content": str(a + b)}]}) + "\n" for a, b in sums))
    prompts.write_text("".join(json.dumps({
        "messages": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}) + "\n"
        for a, b in sums))
    return chat, prompts


STEPS = 60


def test_lora_sft_raises_arithmetic_eval_accuracy(tmp_path):
    """Small sums, learned by the adapter alone (the base is frozen): exact-match accuracy
    of greedy answers on the problems goes from ~0 to most of them. The random base is
    initialised at std 0.3, not 0.02: the frozen tied head and norms then allow confident
    predictions (at 0.02 its logits cannot exceed ~0.6 whatever the adapter does)."""
    from astrai_core.checkpoints.native import save_pretrained
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.model import CausalLM, ModelConfig
    from astrai_core.testing import ARITH_TOKENIZER, TINY_MODEL

    torch.manual_seed(0)
    base = CausalLM(ModelConfig(vocab_size=len(load_tokenizer(ARITH_TOKENIZER)), **TINY_MODEL))
    base.reset_parameters(std=0.3)
    start = save_pretrained(base, tmp_path / "start", tokenizer_dir=ARITH_TOKENIZER)
    chat, prompts = write_sums(tmp_path)
    config = tiny_run_config(tmp_path, chat, {"name": "sft"}, data_format="chat",
                             rewards=[{"name": "exact_match"}], max_steps=STEPS, lr=2e-2,
                             eval_at_start=True, eval_every=STEPS, eval_max_new_tokens=3)
    config["data"].update(batch_size=25, eval={"path": str(prompts), "format": "prompt"})
    config["model"] = {"path": str(start), "lora": {"r": 16, "alpha": 32.0}}
    run(tmp_path, config)
    evaluations = [m for m in read_metrics(tmp_path / "run") if "eval/accuracy" in m]
    first, last = evaluations[0]["eval/accuracy"], evaluations[-1]["eval/accuracy"]
    assert first <= 0.1
    assert last >= 0.6, (first, last)


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_bf16_base_trains_a_float32_adapter(tmp_path, mixed_precision):
    """model.dtype bfloat16: the frozen base is held in bf16, the adapter and its AdamW
    state stay float32 (master weights); with autocast too."""
    start = save_start_model(tmp_path / "start")
    config = lora_config(text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                                         mixed_precision=mixed_precision), start)
    config["model"]["dtype"] = "bfloat16"
    strategy, ctx = build_strategy(config, tmp_path)
    adapter = adapter_parameters(ctx.model)
    assert {p.dtype for p in adapter.values()} == {torch.float32}
    base = [p for n, p in ctx.model.named_parameters() if n not in adapter]
    assert {p.dtype for p in base} == {torch.bfloat16}
    trainer, metrics = one_step(strategy, ctx)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    state = trainer.modules[0].optimizer.state
    assert state and all(s["exp_avg"].dtype == torch.float32 for s in state.values())
    assert any(p.abs().sum() > 0 for n, p in adapter.items() if ".lora_B." in n)
