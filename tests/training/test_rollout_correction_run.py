"""Rollout correction on real rollouts: a sampler that misreports its log-probs by a known
amount moves the correction metrics, and the policy loss takes the weights."""

from __future__ import annotations

import math

import pytest
import torch

from astrai_core.config.schema import RunConfig
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.training.run import train
from tests.training.conftest import SHIFT


def _config(tmp_path, sampler="perturbed", tokens=4, **strategy):
    sampler_section = {"name": sampler, "max_new_tokens": tokens, "stop_token_ids": []}
    if isinstance(sampler, dict):
        sampler_section.update(sampler)
    config = tiny_run_config(
        tmp_path, write_arith_prompts(tmp_path / "prompts.jsonl"),
        {"name": "grpo", "group_size": 4, **strategy}, sampler=sampler_section)
    config["data"]["batch_size"] = 2
    return config


def _first_batch(tmp_path, config):
    """The first micro-batch with the weights and metrics of the rollout's no-grad forward
    (one step per rollout would defer them to the training forward:
    test_one_forward_per_rollout.py)."""
    strategy, run = build_strategy(config, tmp_path)
    strategy.defers_old_logprobs = False
    source = strategy.batch_source()
    return strategy, source.next_step()[0], source.stats


def _even_odd(mask):
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return (positions % 2 == 0) & mask, (positions % 2 == 1) & mask


def test_token_truncation_weights_metrics_and_loss(tmp_path, perturbed_sampler):
    threshold = 1.2
    strategy, batch, stats = _first_batch(tmp_path, _config(
        tmp_path, rollout_correction={"level": "token", "mode": "truncate",
                                      "threshold": threshold}))
    mask = batch.response_mask
    even, odd = _even_odd(mask)
    # w = pi_trainer / pi_sampler = exp(-0.4) on even tokens, exp(0.4) = 1.49 -> 1.2 on odd
    weights = batch.extras["rollout_weights"]
    torch.testing.assert_close(weights[even], torch.full_like(weights[even], math.exp(-SHIFT)),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(weights[odd], torch.full_like(weights[odd], threshold))
    assert weights[~mask].abs().sum() == 0
    n_even, n_odd = int(even.sum()), int(odd.sum())
    raw_mean = (n_even * math.exp(-SHIFT) + n_odd * math.exp(SHIFT)) / (n_even + n_odd)
    assert stats["rollout_correction/weight_mean"] == pytest.approx(raw_mean, rel=1e-4)
    assert stats["rollout_correction/weight_max"] == pytest.approx(math.exp(SHIFT), rel=1e-4)
    assert stats["rollout_correction/truncated_fraction"] == pytest.approx(
        n_odd / (n_even + n_odd))
    k3 = lambda g: math.exp(g) - 1 - g  # noqa: E731
    assert stats["rollout_correction/kl"] == pytest.approx(
        (n_even * k3(-SHIFT) + n_odd * k3(SHIFT)) / (n_even + n_odd), rel=1e-3)
    assert stats["rollout/logprob_diff_mean"] == pytest.approx(SHIFT, abs=1e-4)

    # The loss: token-mean of w * PPO-clip on the trainer's old log-probs (ratio 1 here).
    generator = torch.Generator().manual_seed(0)
    advantages = torch.randn(mask.shape, generator=generator).where(mask, 0.0)
    batch.advantages = advantages  # the rollout's own may all be 0 (equal rewards)
    loss, _ = strategy.compute_loss(batch)
    expected = (-advantages * weights)[mask].mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    batch.extras.pop("rollout_weights")
    unweighted, _ = strategy.compute_loss(batch)
    assert unweighted.item() == pytest.approx((-advantages)[mask].mean().item(), abs=1e-5)
    assert abs(unweighted.item() - loss.item()) > 1e-3


def test_sequence_masking_drops_whole_sequences(tmp_path, perturbed_sampler):
    # Three tokens with log-weights -0.4, +0.4, -0.4: geometric mean exp(-0.4 / 3) = 0.875,
    # outside [1/1.1, 1.1]; the unperturbed half of the rows has weight 1 and stays.
    strategy, batch, stats = _first_batch(tmp_path, _config(
        tmp_path, sampler={"name": "perturbed", "every_other_row": True}, tokens=3,
        rollout_correction={"level": "sequence", "mode": "mask", "threshold": 1.1}))
    mask = batch.response_mask
    assert mask.all()  # no stop token: every response has 3 tokens
    weights = batch.extras["rollout_weights"]
    dropped = weights.sum(-1) == 0
    assert int(dropped.sum()) == len(batch) // 2
    torch.testing.assert_close(weights[~dropped], torch.ones_like(weights[~dropped]),
                               atol=1e-4, rtol=1e-4)
    assert stats["rollout_correction/masked_fraction"] == pytest.approx(0.5)
    assert stats["rollout_correction/weight_mean"] == pytest.approx(
        (1 + math.exp(-SHIFT / 3)) / 2, rel=1e-4)
    # Token level: each token is judged alone; 0.67 and 1.49 both lie outside the range.
    _, batch, stats = _first_batch(tmp_path, _config(
        tmp_path, sampler={"name": "perturbed", "every_other_row": True}, tokens=3,
        rollout_correction={"level": "token", "mode": "mask", "threshold": 1.1}))
    assert stats["rollout_correction/masked_fraction"] == pytest.approx(0.5)
    assert stats["rollout_correction/weight_max"] == pytest.approx(math.exp(SHIFT), rel=1e-4)


def test_off_by_default_and_metrics_in_the_log(tmp_path, perturbed_sampler):
    _, batch, stats = _first_batch(tmp_path, _config(tmp_path))
    assert "rollout_weights" not in batch.extras
    assert not any(k.startswith("rollout_correction/") for k in stats)
    config = _config(tmp_path, rollout_correction={"threshold": 1.2}, mini_batches=1)
    config["trainer"]["max_steps"] = 2
    train(RunConfig.model_validate(config), overwrite=True)
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 2
    for record in metrics:
        assert record["rollout_correction/truncated_fraction"] > 0.2
        assert record["rollout_correction/weight_max"] == pytest.approx(math.exp(SHIFT), rel=1e-3)


def test_an_honest_sampler_gives_unit_weights(tmp_path):
    _, batch, stats = _first_batch(tmp_path, _config(
        tmp_path, sampler="torch", rollout_correction={"mode": "mask", "threshold": 1.01}))
    mask = batch.response_mask
    torch.testing.assert_close(batch.extras["rollout_weights"][mask],
                               torch.ones(int(mask.sum())), atol=1e-4, rtol=1e-4)
    assert stats["rollout_correction/masked_fraction"] == 0.0
    assert stats["rollout_correction/kl"] < 1e-8


def test_correction_needs_the_trainer_old_logprobs(tmp_path):
    config = _config(tmp_path, sampler="torch", rollout_correction={},
                     recompute_old_logprobs=False)
    with pytest.raises(Exception, match="needs recompute_old_logprobs: true"):
        build_strategy(config, tmp_path)
