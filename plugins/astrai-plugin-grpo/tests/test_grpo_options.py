"""GRPO's options and logged metrics against their formulas, on real rollouts of the tiny
model: kl_in_reward_coef (reward shaping), entropy_coef, mini_batches x epochs, and the
rollout statistics. Every reference log-prob comes from an unpadded per-row forward
(astrai_core.testing.reference_log_softmax), never from the strategy's own code."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

from astrai_core.testing import (DIGIT_REWARD, build_strategy, reference_log_softmax,
                                 reference_token_logprobs, tiny_run_config)

TEMPERATURE = 0.8


def _strategy(tmp_path, prompts, **options):
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 4, **options},
                             sampler={"temperature": TEMPERATURE, "max_new_tokens": 4})
    config["data"]["batch_size"] = 3
    strategy, ctx = build_strategy(config, tmp_path)
    strategy.source = strategy.batch_source()  # the test's one source of micro-batches
    return strategy, ctx


def _perturb(model, seed=0):
    """Make a frozen reference differ from the policy, so KL terms are not zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))


def _group_normalised(scores: list[float], groups: list[int], eps: float = 1e-6) -> list[float]:
    """(s - group mean) / (unbiased group std + eps), written out."""
    out = []
    for score, group in zip(scores, groups, strict=True):
        members = [s for s, g in zip(scores, groups, strict=True) if g == group]
        mean = sum(members) / len(members)
        std = (sum((s - mean) ** 2 for s in members) / (len(members) - 1)) ** 0.5
        out.append((score - mean) / (std + eps))
    return out


def _digit_reward(text: str) -> float:
    return 1.0 if re.search(DIGIT_REWARD["pattern"], text) else 0.0


def _row_key(batch, i):
    """A row's identity: its prompt, its response tokens and behaviour log-probs."""
    valid = batch.response_mask[i]
    return (batch.prompts[i], tuple(batch.response_ids[i][valid].tolist()),
            tuple(round(x, 5) for x in batch.old_logprobs[i][valid].tolist()))


def test_kl_reward_shaping_advantages_and_rollout_metrics_equal_their_formulas(tmp_path, prompts):
    coef = 0.3
    strategy, ctx = _strategy(tmp_path, prompts, kl_in_reward_coef=coef, kl_estimator="k2")
    _perturb(strategy.reference)
    batch = strategy.source.next_step()[0]  # one micro-batch: the whole rollout, shuffled
    assert len(batch) == 12
    policy = reference_token_logprobs(ctx.model, batch, TEMPERATURE)
    ref = reference_token_logprobs(strategy.reference, batch, TEMPERATURE)
    old = [batch.old_logprobs[i][batch.response_mask[i]].double() for i in range(len(batch))]

    # the sampler's behaviour log-probs are the policy's (the sampler contract)
    assert max((o - p).abs().max().item() for o, p in zip(old, policy)) <= 1e-5
    rewards = [_digit_reward(text) for text in batch.completions]
    assert batch.rewards.tolist() == rewards
    # token rewards: the score on the last token, minus coef * k2(old, ref) on every token
    scores = [r - coef * (0.5 * (o - f).square()).sum().item()
              for r, o, f in zip(rewards, old, ref, strict=True)]
    expected = _group_normalised(scores, batch.group_ids.tolist())
    advantages = batch.advantages
    for i, value in enumerate(expected):
        valid = batch.response_mask[i]
        assert advantages[i][valid].tolist() == pytest.approx([value] * int(valid.sum()), abs=1e-4)
        assert advantages[i][~valid].abs().sum() == 0
    shaped_off = _group_normalised(rewards, batch.group_ids.tolist())
    assert max(abs(a - b) for a, b in zip(expected, shaped_off)) > 1e-3  # shaping mattered

    stats = strategy.source.stats
    lengths = [float(m.sum()) for m in batch.response_mask]
    tokens = [v for i, v in enumerate(expected) for _ in range(int(lengths[i]))]
    mean = sum(tokens) / len(tokens)
    assert stats["rollout/reward_mean"] == pytest.approx(sum(rewards) / 12)
    assert stats["rollout/reward_std"] == pytest.approx(torch.tensor(rewards).std(unbiased=False).item())
    assert stats["rollout/response_length_mean"] == pytest.approx(sum(lengths) / 12)
    assert stats["rollout/advantage_mean"] == pytest.approx(mean, abs=1e-5)
    assert stats["rollout/advantage_std"] == pytest.approx(
        (sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1)) ** 0.5, rel=1e-4)
    # the loss metrics of that micro-batch: kl (k2 of policy vs reference) and the ratio
    assert "rollout/logprob_diff_max" not in stats  # one step per rollout: measured in the loss
    _, metrics = strategy.compute_loss(batch)
    diffs = [d for o, p in zip(old, policy) for d in (o - p).abs().tolist()]
    mismatch = strategy.step_metrics()
    assert mismatch["rollout/logprob_diff_max"] == pytest.approx(max(diffs), abs=1e-6)
    assert mismatch["rollout/logprob_diff_mean"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-6)
    kl = [x for p, f in zip(policy, ref) for x in (0.5 * (p - f).square()).tolist()]
    assert metrics["kl"].item() == pytest.approx(sum(kl) / len(kl), rel=1e-4)
    assert metrics["ratio_mean"].item() == pytest.approx(1.0, abs=1e-4)
    assert metrics["tokens"].item() == sum(lengths)


def test_entropy_bonus_equals_its_formula(tmp_path, prompts):
    coef = 0.05
    strategy, ctx = _strategy(tmp_path, prompts, entropy_coef=coef,
                              loss_aggregation="seq-mean-token-mean")
    batch = strategy.source.next_step()[0]
    loss, metrics = strategy.compute_loss(batch)
    logps = reference_log_softmax(ctx.model, batch, TEMPERATURE)
    per_row, entropies = [], []
    for i, logp in enumerate(logps):
        valid = batch.response_mask[i]
        taken = logp.gather(-1, batch.response_ids[i][valid][:, None]).squeeze(-1)
        ratio = torch.exp(taken - batch.old_logprobs[i][valid].double())
        advantage = batch.advantages[i][valid].double()
        eps = 0.2
        policy = torch.maximum(-advantage * ratio, -advantage * ratio.clamp(1 - eps, 1 + eps))
        entropy = -(logp.exp() * logp).sum(-1)  # H of softmax(logits / T), written out
        entropies += entropy.tolist()
        per_row.append((policy - coef * entropy).mean().item())
    assert loss.item() == pytest.approx(sum(per_row) / len(per_row), rel=1e-5, abs=1e-6)
    assert metrics["entropy"].item() == pytest.approx(sum(entropies) / len(entropies), rel=1e-5)
    assert coef * metrics["entropy"].item() > 1e-3  # the bonus is not negligible here


def test_mini_batches_and_epochs_partition_one_rollout(tmp_path, prompts):
    strategy, ctx = _strategy(tmp_path, prompts, mini_batches=2, epochs=2)
    steps = [strategy.source.next_step()[0] for _ in range(4)]  # 2 epochs x 2 mini-batches
    assert [len(b) for b in steps] == [6, 6, 6, 6]
    keys = [Counter(_row_key(b, i) for i in range(len(b))) for b in steps]
    rollout = keys[0] + keys[1]
    assert sum(rollout.values()) == 12
    assert keys[2] + keys[3] == rollout                 # epoch 2: the same rows again...
    assert keys[2] != keys[0]                           # ...in a fresh order
    # advantages are normalised over the whole rollout's groups, not each mini-batch
    first_epoch = [(b, i) for b in steps[:2] for i in range(len(b))]
    groups = [int(b.group_ids[i]) for b, i in first_epoch]
    rewards = [float(b.rewards[i]) for b, i in first_epoch]
    expected = _group_normalised(rewards, groups)
    for (b, i), value in zip(first_epoch, expected, strict=True):
        valid = b.response_mask[i]
        assert b.advantages[i][valid][0].item() == pytest.approx(value, abs=1e-4)
    assert len(set(groups)) == 3 and any(v != 0 for v in expected)
    fifth = strategy.source.next_step()[0]              # then a new rollout is drawn
    fifth_keys = Counter(_row_key(fifth, i) for i in range(len(fifth)))
    assert not (fifth_keys <= rollout)
