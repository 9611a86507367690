"""The grpo strategy: registry, loss against its formula, learning, offline old model, errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from astrai_core.config.loader import load_config
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.testing import (build_strategy, read_metrics, tiny_run_config,
                                 write_arith_prompts)
from astrai_core.training.run import train
from astrai_core.training.trainer import Trainer


def _train(tmp_path, config):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    train(load_config(path), overwrite=True)
    return read_metrics(tmp_path / "run")


def test_clip_eps_sets_both_clip_bounds():
    from astrai_plugin_grpo.strategy import GRPOConfig

    config = GRPOConfig.model_validate({"clip_eps": 0.3})
    assert (config.eps_low, config.eps_high) == (0.3, 0.3)
    assert GRPOConfig().eps_high == 0.2
    with pytest.raises(ValueError, match="either clip_eps or eps_low"):
        GRPOConfig.model_validate({"clip_eps": 0.3, "eps_high": 0.28})


def test_strategy_loads_by_name():
    from astrai_plugin_grpo.strategy import GRPO

    spec = load_plugins().get("strategy", "grpo")
    assert spec.load() is GRPO
    assert spec.default_advantage == "grpo"  # read by the run plan


def test_online_grpo_raises_the_reward(tmp_path, prompts):
    # Reward: the completion contains a digit (~45% for the random tiny model).
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 8},
                             max_steps=8, lr=2e-2)
    config["data"]["batch_size"] = 4
    metrics = [m for m in _train(tmp_path, config) if "rollout/reward_mean" in m]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    first = metrics[0]["rollout/reward_mean"]
    last = sum(m["rollout/reward_mean"] for m in metrics[-3:]) / 3
    assert first < 0.7
    assert last > first + 0.25, (first, last)
    assert metrics[-1]["entropy"] < metrics[0]["entropy"]
    for name in ("clip_fraction", "approx_kl", "ratio_mean", "ratio_max", "tokens",
                 "rollout/reward_std", "rollout/response_length_mean"):
        assert name in metrics[-1]


def _hand_batch(vocab: int) -> RolloutBatch:
    """Two prompts (one left-padded) and responses of lengths 3 and 2 (one right-padded)."""
    generator = torch.Generator().manual_seed(3)
    prompt_ids = torch.tensor([[0, 3, 20, 11], [3, 21, 11, 22]])
    prompt_mask = torch.tensor([[False, True, True, True], [True, True, True, True]])
    response_ids = torch.tensor([[18, 19, 5], [23, 5, 0]])
    response_mask = torch.tensor([[True, True, True], [True, True, False]])
    old = -torch.rand(2, 3, generator=generator) * 4 - 1
    advantages = torch.tensor([[1.5, 1.5, 1.5], [-0.7, -0.7, 0.0]])
    assert int(response_ids.max()) < vocab
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                        response_ids=response_ids, response_mask=response_mask,
                        old_logprobs=old.where(response_mask, 0.0), rewards=torch.zeros(2),
                        reward_components={}, group_ids=torch.tensor([0, 0]),
                        advantages=advantages)


def _direct_logprobs(model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) of each response token, indexed by hand."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    attention = torch.cat([batch.prompt_mask, batch.response_mask], 1).long()
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    logits = model(ids, attention_mask=attention, position_ids=positions)["logits"]
    width = batch.prompt_ids.shape[1]
    out = torch.zeros(batch.response_ids.shape)
    for row in range(ids.shape[0]):
        for t in range(batch.response_ids.shape[1]):
            logp = torch.log_softmax(logits[row, width + t - 1].double() / temperature, -1)
            out[row, t] = logp[batch.response_ids[row, t]].float()
    return out


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_loss_equals_the_formula(tmp_path, prompts, aggregation):
    eps_low, eps_high, kl_coef, temperature = 0.2, 0.28, 0.3, 0.7
    config = tiny_run_config(tmp_path, prompts, {
        "name": "grpo", "eps_low": eps_low, "eps_high": eps_high, "kl_coef": kl_coef,
        "kl_estimator": "k3", "loss_aggregation": aggregation})
    config["sampler"]["temperature"] = temperature
    strategy, ctx = build_strategy(config, tmp_path)
    with torch.no_grad():  # make the reference differ from the policy
        for param in strategy.reference.parameters():
            param.add_(0.05 * torch.randn_like(param))
    batch = _hand_batch(ctx.model.config.vocab_size)
    batch.ref_logprobs = _direct_logprobs(strategy.reference, batch, temperature)
    loss, metrics = strategy.compute_loss(batch)

    logp = _direct_logprobs(ctx.model, batch, temperature).double()
    ref = batch.ref_logprobs.double()
    ratio = torch.exp(logp - batch.old_logprobs.double())
    adv = batch.advantages.double()
    policy = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    per_token = policy + kl_coef * k3
    mask = batch.response_mask
    if aggregation == "token-mean":
        expected = per_token[mask].mean()
    else:
        expected = torch.stack([per_token[i][mask[i]].mean() for i in range(2)]).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert metrics["tokens"].item() == 5
    assert metrics["kl"].item() == pytest.approx(k3[mask].mean().item(), rel=1e-4)
    clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    assert metrics["clip_fraction"].item() == pytest.approx(clipped[mask].double().mean().item())
    assert metrics["ratio_max"].item() == pytest.approx(ratio[mask].max().item(), rel=1e-5)
    loss.backward()  # the objective reaches the policy's weights
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in ctx.model.parameters())


def _strip_logprobs(sampler):
    generate = sampler.generate

    def without_logprobs(*args, **kwargs):
        completions = generate(*args, **kwargs)
        for completion in completions:
            completion.logprobs = []
        return completions
    sampler.generate = without_logprobs


def test_missing_behaviour_logprobs_is_a_clear_error(tmp_path, prompts):
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2})
    strategy, run = build_strategy(config, tmp_path)
    _strip_logprobs(run.rollouts.sampler)
    with pytest.raises(ConfigError, match="no behaviour log-probs.*recompute_old_logprobs"):
        strategy.batch_source().next_step()


@pytest.mark.parametrize("epochs", [1, 2])
def test_missing_logprobs_are_recomputed_when_configured(tmp_path, prompts, epochs):
    """With 2 epochs a no-grad forward recomputes them per rollout; with one step per
    rollout the training forward supplies them (detached) instead."""
    from astrai_core.api import policy_forward
    from astrai_core.testing import reference_token_logprobs

    config = tiny_run_config(tmp_path, prompts, {
        "name": "grpo", "group_size": 2, "recompute_old_logprobs": True, "epochs": epochs})
    strategy, ctx = build_strategy(config, tmp_path)
    _strip_logprobs(ctx.rollouts.sampler)
    micro = strategy.batch_source().next_step()[0]
    expected = torch.cat(reference_token_logprobs(ctx.model, micro, ctx.logprob_temperature))
    mask = micro.response_mask
    if epochs == 1:
        assert micro.old_logprobs is None
        logprobs = policy_forward(ctx.model, micro, ctx.logprob_temperature)["logprobs"]
        old = strategy.old_logprobs_for(micro, logprobs)
        assert not old.requires_grad and torch.equal(old[mask], logprobs[mask].detach())
    else:
        old = micro.old_logprobs
    torch.testing.assert_close(old[mask].double(), expected, rtol=0, atol=1e-5)


def test_unknown_loss_aggregation_names_the_field(tmp_path, prompts):
    config = tiny_run_config(tmp_path, prompts,
                             {"name": "grpo", "loss_aggregation": "seq-sum"})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"strategy\.loss_aggregation"):
        train(load_config(path))
    assert not (tmp_path / "run").exists()  # failed before any work


def _offline_rows(path):
    """Two answers per prompt: the right one rewarded 1, a wrong one 0 (one group each)."""
    with path.open("w") as f:
        for a in range(4):
            for response, reward in ((str(a + 2), 1.0), (str((a + 5) % 10), 0.0)):
                f.write(json.dumps({"messages": [{"role": "user", "content": f"{a}+2="}],
                                    "response": response, "reward": reward, "group": a}) + "\n")
    return path


def _rewarded_minus_unrewarded(strategy, ctx) -> float:
    """Mean response log-prob of the reward-1 rows minus that of the reward-0 rows."""
    from astrai_core.data import build_train_loader
    from astrai_core.rollout.forward import policy_forward
    from astrai_plugin_grpo.offline import offline_rollout

    loader = build_train_loader(ctx.data, ctx.tokenizer)
    batch = offline_rollout(next(iter(loader)) + next(iter(loader)), ctx.tokenizer)
    with torch.no_grad():
        logps = policy_forward(ctx.model, batch)["logprobs"]
    totals = logps.where(batch.response_mask, 0.0).sum(1)
    rewarded = batch.rewards == 1
    return (totals[rewarded].mean() - totals[~rewarded].mean()).item()


def test_offline_old_policy_is_the_policy_after_each_step(tmp_path):
    data = _offline_rows(tmp_path / "offline.jsonl")
    config = tiny_run_config(tmp_path, data, {"name": "grpo", "mode": "offline"},
                             max_steps=3, grad_accum_steps=2)
    config["data"].update(shuffle=False, batch_size=4)
    strategy, ctx = build_strategy(config, tmp_path)
    trainer = Trainer(ctx, strategy)
    start = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    after_steps = [start]
    checked = []
    after_step = strategy.after_optimizer_step
    process = trainer.source.process

    def check(rollout):
        # Each batch's old log-probs come from the weights the previous step left.
        policy = ctx.model.state_dict()
        assert all(torch.equal(after_steps[-1][k], policy[k]) for k in policy)
        return process(rollout)

    def record(step):
        after_step(step)
        after_steps.append({k: v.clone() for k, v in ctx.model.state_dict().items()})
        checked.append(step)
    trainer.source.process = check
    strategy.after_optimizer_step = record
    preference_before = _rewarded_minus_unrewarded(strategy, ctx)
    last = trainer.fit()
    assert checked == [1, 2, 3]
    assert any(not torch.equal(start[k], v) for k, v in ctx.model.state_dict().items())
    # The rewarded answers gained log-probability relative to the unrewarded ones.
    preference_after = _rewarded_minus_unrewarded(strategy, ctx)
    assert preference_after > preference_before + 0.5, (preference_before, preference_after)
    # The old log-probs were the policy's at the start of each step: the ratio is exactly 1.
    assert last["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert last["data/reward_mean"] == pytest.approx(0.5)


def test_offline_rows_need_a_numeric_reward(tmp_path):
    from astrai_core.errors import DataError

    data = write_arith_prompts(tmp_path / "bad.jsonl", count=8, response="4",
                               reward="high")
    config = tiny_run_config(tmp_path, data, {"name": "grpo", "mode": "offline"})
    strategy, _ = build_strategy(config, tmp_path)
    with pytest.raises(DataError, match="numeric column 'reward'"):
        strategy.batch_source().next_step()


def test_policy_loss_and_rollout_correction_options():
    from astrai_plugin_grpo.strategy import GRPOConfig

    config = GRPOConfig.model_validate({"policy_loss": {"name": "cispo", "eps_high": 2.0},
                                        "rollout_correction": {"mode": "mask"}})
    choice = config.policy_loss_choice()
    assert (choice.name, choice.params, choice.path) == (
        "cispo", {"eps_high": 2.0}, ("strategy", "policy_loss"))
    assert config.rollout_correction.threshold == 2.0 and config.rollout_correction.level == "token"
    default = GRPOConfig.model_validate({"eps_high": 0.28}).policy_loss_choice()
    assert (default.name, default.params) == ("ppo_clip", {"eps_low": 0.2, "eps_high": 0.28})
    with pytest.raises(ValueError, match="offline data has none"):
        GRPOConfig.model_validate({"mode": "offline", "rollout_correction": {}})
    with pytest.raises(ValueError, match="clip_eps"):
        GRPOConfig.model_validate({"clip_eps": 0.1, "eps_low": 0.1})
