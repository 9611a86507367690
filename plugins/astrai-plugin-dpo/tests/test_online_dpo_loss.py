"""Online DPO on a real rollout: the pairs are each group's best and worst completion, and
the loss is -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))) with sequence log-probs
at temperature 1 from an unpadded per-row forward (never the strategy's own code)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from astrai_core.testing import (build_strategy, reference_token_logprobs, tiny_run_config,
                                 write_arith_prompts)

BETA = 0.2


def _capture_rollouts(run) -> list:
    """The rollouts the runner draws (the one internal reached: ``run.rollouts.draw``)."""
    served = []
    draw = run.rollouts.draw

    def capture():
        served.append(draw())
        return served[-1]

    run.rollouts.draw = capture
    return served


def _best_and_worst(rewards: list[float], groups: list[int]) -> list[tuple[int, int]]:
    """Per group (in order of appearance) with differing rewards: (first best, first worst)."""
    pairs = []
    for group in dict.fromkeys(groups):
        rows = [i for i, g in enumerate(groups) if g == group]
        values = [rewards[i] for i in rows]
        if max(values) != min(values):
            pairs.append((rows[values.index(max(values))], rows[values.index(min(values))]))
    return pairs


def _response(batch, i) -> list[int]:
    return batch.response_ids[i][batch.response_mask[i]].tolist()


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_online_dpo_loss_equals_its_formula_on_rollout_pairs(tmp_path, label_smoothing):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {
        "name": "dpo", "mode": "online", "group_size": 4, "beta": BETA,
        "label_smoothing": label_smoothing}, sampler={"temperature": 1.3, "max_new_tokens": 4})
    config["data"]["batch_size"] = 4
    strategy, ctx = build_strategy(config, tmp_path)
    with torch.no_grad():  # a reference that differs from the policy
        generator = torch.Generator().manual_seed(0)
        for param in strategy.reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    served = _capture_rollouts(ctx)
    batch = strategy.batch_source().next_step()[0]
    rollout = served[-1]
    pairs = _best_and_worst(rollout.rewards.tolist(), rollout.group_ids.tolist())
    assert len(pairs) >= 2 and len(batch) == 2 * len(pairs)
    n = len(pairs)
    for k, (best, worst) in enumerate(pairs):  # rows [:n] chosen, [n:] rejected, in order
        assert _response(batch, k) == _response(rollout, best)
        assert _response(batch, n + k) == _response(rollout, worst)
        assert batch.prompts[k] == batch.prompts[n + k] == rollout.prompts[best]
        assert batch.rewards[k] > batch.rewards[n + k]

    loss, metrics = strategy.compute_loss(batch)
    policy = torch.stack([x.sum() for x in reference_token_logprobs(ctx.model, batch)])
    ref = torch.stack([x.sum() for x in reference_token_logprobs(strategy.reference, batch)])
    chosen_ratio, rejected_ratio = policy[:n] - ref[:n], policy[n:] - ref[n:]
    h = BETA * (chosen_ratio - rejected_ratio)
    expected = (-(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["chosen_reward"].item() == pytest.approx((BETA * chosen_ratio).mean().item(), abs=1e-6)
    assert metrics["rejected_reward"].item() == pytest.approx((BETA * rejected_ratio).mean().item(), abs=1e-6)
    assert metrics["margin"].item() == pytest.approx(h.mean().item(), abs=1e-6)
    assert h.abs().max() > 1e-3  # the reference really differs: the formula is exercised
