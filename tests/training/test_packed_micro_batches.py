"""trainer.micro_batch_tokens: a packed micro-batch (its rows as one sequence, no padding,
kept apart by the block-diagonal mask) gives the loss, metrics and gradients of the same
rows padded, for every loss aggregation, GRPO and PPO (the critic included) and LoRA;
a whole packed run equals the padded one; the options are checked."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from astrai_core.errors import ConfigError
from astrai_core.rollout.packing import padding_fraction, token_micro_batches
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.training.trainer import Trainer
from tests.training.reference import save_start_model, text_run_config, write_texts

BUDGET = 40  # tokens: a rollout of 8 rows of 5-14 tokens makes several micro-batches
TOL = 1e-5


def _config(tmp_path, strategy, **trainer):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    # lengths differ: up to 8 new tokens, stopping at EOS
    return tiny_run_config(tmp_path, prompts, strategy, data={"batch_size": 4},
                           sampler={"max_new_tokens": 8, "temperature": 1.5}, **trainer)


def _loss_and_grads(strategy, run, batch):
    modules = [run.model, *(m.module for m in strategy.trained_modules().values())]
    for module in modules:
        module.zero_grad(set_to_none=True)
        module.train()
    loss, metrics = strategy.compute_loss(batch)
    loss.backward()
    grads = {f"{i}.{name}": p.grad.clone() for i, module in enumerate(modules)
             for name, p in module.named_parameters() if p.grad is not None}
    metrics = {k: float(v) for k, v in metrics.items()}
    return loss.item(), metrics, grads


STRATEGIES = {
    **{f"grpo {mode}": {"name": "grpo", "group_size": 2, "loss_aggregation": mode,
                        "kl_coef": 0.1, "entropy_coef": 0.01}
       for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                    "seq-mean-token-sum-norm")},
    **{f"ppo {mode}": {"name": "ppo", "group_size": 2, "loss_aggregation": mode,
                       "epochs": 1, "mini_batches": 1, "kl_coef": 0.1}
       for mode in ("token-mean", "seq-mean-token-mean")},
}


def _with_environment_tokens(batch):
    """Multi-turn rows: the second response token of every row becomes an environment
    token (attended to, not trained on)."""
    context = batch.response_mask.clone()
    response = batch.response_mask.clone()
    response[:, 1] = False
    return replace(batch, context_mask=context, response_mask=response)


def _assert_packed_equals_padded(strategy, run, change=lambda batch: batch):
    parts = [change(part) for part in strategy.batch_source().next_step()]
    assert len(parts) >= 2 and all(p.packed for p in parts)
    assert all(int(p.attention_mask().sum()) <= BUDGET or len(p) == 1 for p in parts)
    for part in parts:
        loss, metrics, grads = _loss_and_grads(strategy, run, part)
        ref_loss, ref_metrics, ref_grads = _loss_and_grads(strategy, run,
                                                           replace(part, packed=False))
        assert loss == pytest.approx(ref_loss, abs=TOL)
        assert metrics.keys() == ref_metrics.keys()
        for key, value in ref_metrics.items():
            assert metrics[key] == pytest.approx(value, rel=TOL, abs=TOL), key
        assert grads.keys() == ref_grads.keys() and grads
        for key, value in ref_grads.items():
            torch.testing.assert_close(grads[key], value, rtol=0, atol=TOL, msg=key)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_packed_micro_batch_equals_padded(tmp_path, name):
    config = _config(tmp_path, STRATEGIES[name], micro_batch_tokens=BUDGET)
    strategy, run = build_strategy(config, tmp_path)
    _assert_packed_equals_padded(strategy, run)


def test_packed_environment_tokens_equal_padded(tmp_path):
    config = _config(tmp_path, STRATEGIES["ppo token-mean"], micro_batch_tokens=BUDGET)
    strategy, run = build_strategy(config, tmp_path)
    _assert_packed_equals_padded(strategy, run, _with_environment_tokens)


def test_packed_lora_equals_padded(tmp_path):
    start = save_start_model(tmp_path / "start")
    config = _config(tmp_path, STRATEGIES["grpo token-mean"], micro_batch_tokens=BUDGET)
    config["model"] = {"path": str(start), "lora": {"r": 4, "alpha": 8.0}}
    strategy, run = build_strategy(config, tmp_path)
    _assert_packed_equals_padded(strategy, run)


def test_micro_batches_respect_the_budget_and_rank_shares(tmp_path):
    strategy, run = build_strategy(_config(tmp_path, STRATEGIES["grpo token-mean"]), tmp_path)
    rollout, _ = strategy.process_rollout(run.rollouts.draw())
    lengths = rollout.attention_mask().sum(-1).tolist()
    for budget, world in ((1, 1), (BUDGET, 1), (BUDGET, 2), (10_000, 2)):
        parts = token_micro_batches(rollout, budget, world)
        assert sum(len(p) for p in parts) == len(rollout)
        assert all(len(p) % world == 0 for p in parts)
        for part in parts:  # each rank's contiguous share within the budget, or one step
            share = len(part) // world
            tokens = part.attention_mask().sum(-1).tolist()
            assert len(part) == world or all(
                sum(tokens[r * share:(r + 1) * share]) <= budget for r in range(world))
        if budget == 1:
            assert len(parts) == len(rollout) // world
        if budget == 10_000:
            assert len(parts) == 1
    assert padding_fraction(parts) == 0.0
    padded = [replace(p, packed=False) for p in parts]
    expected = 1 - sum(lengths) / rollout.attention_mask().numel()
    assert padding_fraction(padded) == pytest.approx(expected)


def _fit(tmp_path, name, strategy, **trainer):
    # Adam's first steps scale a near-zero gradient's float noise up to lr: eps=1e-6
    # keeps that noise at its own size (as in the distributed equality tests)
    config = _config(tmp_path, strategy, max_steps=3, lr=2e-3, eps=1e-6, **trainer)
    config["output_dir"] = str(tmp_path / name)
    strategy, run = build_strategy(config, tmp_path)
    Trainer(run, strategy).fit()
    metrics = [{k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))}
               for m in read_metrics(tmp_path / name) if "loss" in m]
    return run.model.state_dict(), metrics


# epochs: 2 keeps the per-rollout no-grad forward of the old log-probs (packed as well)
RUNS = {"grpo seq-mean-token-mean": STRATEGIES["grpo seq-mean-token-mean"],
        "ppo token-mean": STRATEGIES["ppo token-mean"],
        "grpo 2 epochs recomputed": {**STRATEGIES["grpo token-mean"], "epochs": 2,
                                     "recompute_old_logprobs": True},
        "ppo 2 epochs": {**STRATEGIES["ppo token-mean"], "epochs": 2}}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_packed_run_equals_the_padded_run(tmp_path, name):
    """One packed micro-batch per step against one padded one: the same run (the
    reference's and the critic's no-grad forwards over each rollout packed too)."""
    weights, metrics = _fit(tmp_path, "packed", RUNS[name], micro_batch_tokens=10_000)
    ref_weights, ref_metrics = _fit(tmp_path, "padded", RUNS[name])
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=TOL, msg=key)
    for got, want in zip(metrics, ref_metrics, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=TOL, abs=TOL), key


# what stays the same however a step's rows are cut into micro-batches (the other metrics
# are means of the micro-batches' means)
STEP_METRICS = ("loss", "grad_norm", "tokens", "rollout/reward_mean", "rollout/advantage_mean")


@pytest.mark.parametrize("name", sorted(n for n in STRATEGIES if n.startswith("grpo")))
def test_several_packed_micro_batches_per_step_equal_one_padded(tmp_path, name, monkeypatch):
    """Each step's rows in several packed micro-batches (BUDGET tokens each) against one
    padded micro-batch: the same losses, gradient norms and weights, for every loss
    aggregation, only if each micro-batch counts by the tokens or rows it averages over."""
    from astrai_core.online.source import RolloutSource

    counts, next_step = [], RolloutSource.next_step

    def counted(self):
        parts = next_step(self)
        counts.append(len(parts))
        return parts

    monkeypatch.setattr(RolloutSource, "next_step", counted)
    weights, metrics = _fit(tmp_path, "packed", STRATEGIES[name], micro_batch_tokens=BUDGET)
    assert len(counts) == 3 and min(counts) >= 2, counts
    ref_weights, ref_metrics = _fit(tmp_path, "padded", STRATEGIES[name])
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=TOL, msg=key)
    for got, want in zip(metrics, ref_metrics, strict=True):
        for key in STEP_METRICS:
            assert got[key] == pytest.approx(want[key], rel=TOL, abs=TOL), key


def test_options_are_checked(tmp_path):
    config = _config(tmp_path, STRATEGIES["grpo token-mean"], micro_batch_tokens=64,
                     grad_accum_steps=2)
    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens.*grad_accum_steps"):
        build_strategy(config, tmp_path)
    config = _config(tmp_path, {**STRATEGIES["grpo token-mean"], "router_replay": "R2"},
                     micro_batch_tokens=64)
    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens.*router_replay"):
        build_strategy(config, tmp_path)
    start = save_start_model(tmp_path / "start")
    offline = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                              micro_batch_tokens=64)
    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens.*draws no rollouts"):
        build_strategy(offline, tmp_path)
