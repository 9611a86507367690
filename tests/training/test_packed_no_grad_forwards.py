"""trainer.micro_batch_tokens also packs the per-rollout no-grad forwards (old log-probs
when they are not deferred, reference log-probs, PPO's critic values): on a long-tailed
rollout they run as packed sequences of at most the budget's tokens, and give the padded
forwards' numbers, put back in the rollout's row order."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from astrai_core.testing import build_strategy
from tests.training.test_packed_micro_batches import BUDGET, STRATEGIES, TOL, _config

# epochs: 2 keeps the no-grad forward of the old log-probs (no deferral); recomputed, they
# are the trainer's; kl_coef: a reference model.
CASES = {name: {**STRATEGIES[name], "epochs": 2, "recompute_old_logprobs": True}
         for name in ("grpo token-mean", "ppo token-mean")}
ROW_TENSORS = ("old_logprobs", "ref_logprobs", "values", "advantages", "returns")


def _long_tailed(rollout):
    """Every row but the longest cut to its first response token: most rows short, one
    long (the response width stays the longest row's)."""
    mask = rollout.response_mask.clone()
    longest = int(mask.sum(-1).argmax())
    keep = torch.zeros_like(mask)
    keep[:, 0] = True
    keep[longest] = True
    mask &= keep
    return replace(rollout, response_mask=mask, context_mask=None,
                   response_ids=torch.where(mask, rollout.response_ids, 0),
                   old_logprobs=torch.where(mask, rollout.old_logprobs, 0.0))


def _spy(modules):
    """Record the [rows, length] of every no-grad forward of these modules."""
    calls = {name: [] for name in modules}
    for name, module in modules.items():
        def forward(*args, _name=name, _forward=module.forward, **kwargs):
            if not torch.is_grad_enabled():
                calls[_name].append(tuple(args[0].shape))
            return _forward(*args, **kwargs)
        module.forward = forward
    return calls


def _models(strategy, run):
    models = {"policy": run.model, "reference": strategy.reference}
    if hasattr(strategy, "critic"):
        models["critic"] = strategy.critic.backbone
    return models


@pytest.mark.parametrize("name", sorted(CASES))
def test_packed_no_grad_forwards_equal_the_padded_ones(tmp_path, name):
    config = _config(tmp_path, CASES[name], micro_batch_tokens=BUDGET)
    config["sampler"]["max_new_tokens"] = BUDGET - 8  # a long row fits the budget
    strategy, run = build_strategy(config, tmp_path)
    rollout = _long_tailed(run.rollouts.draw())
    rows, width = rollout.attention_mask().shape
    assert rows * width > 2 * int(rollout.attention_mask().sum())  # most slots padding
    calls = _spy(_models(strategy, run))
    packed, packed_stats = strategy.process_rollout(rollout)
    packed_calls = {key: list(value) for key, value in calls.items()}
    for value in calls.values():
        value.clear()
    run.trainer.micro_batch_tokens = None
    padded, padded_stats = strategy.process_rollout(rollout)
    for model, shapes in packed_calls.items():  # one padded forward became packed ones
        assert calls[model] == [(rows, width)], model
        assert len(shapes) >= 2 and all(length <= BUDGET and batch == 1
                                        for batch, length in shapes), model
        assert sum(length for _, length in shapes) == int(rollout.attention_mask().sum())
    for key in ROW_TENSORS:
        want = getattr(padded, key)
        if key == "values" and want is None:  # grpo: no critic
            continue
        torch.testing.assert_close(getattr(packed, key), want, rtol=0, atol=TOL, msg=key)
    assert packed_stats.keys() == padded_stats.keys()
    for key, value in padded_stats.items():
        assert packed_stats[key] == pytest.approx(value, rel=TOL, abs=TOL), key


class _OtherRankNeedsFive:
    """A DistContext stand-in whose other rank packed its rows into 5 micro-batches."""

    enabled = True
    context_size = 1  # no context parallelism: each rank's rows are its own

    def all_gather_object(self, count):
        return [count, 5]


def test_a_rank_with_fewer_micro_batches_runs_as_many_forwards_as_the_others(tmp_path):
    """Under FSDP every forward gathers weights collectively: a rank whose rows pack into
    fewer micro-batches repeats its last one (outputs unused) so the ranks stay in step."""
    from astrai_core.rollout.forward import rollout_forward

    config = _config(tmp_path, CASES["grpo token-mean"], micro_batch_tokens=BUDGET)
    config["sampler"]["max_new_tokens"] = BUDGET - 8
    strategy, run = build_strategy(config, tmp_path)
    rollout = _long_tailed(run.rollouts.draw())
    calls = _spy({"policy": run.model})
    with torch.no_grad():
        alone = rollout_forward(run.model, rollout, 1.0, BUDGET)["logprobs"]
        own = len(calls["policy"])
        assert 2 <= own < 5
        calls["policy"].clear()
        in_step = rollout_forward(run.model, rollout, 1.0, BUDGET,
                                  dist=_OtherRankNeedsFive())["logprobs"]
    assert len(calls["policy"]) == 5
    assert torch.equal(in_step, alone)
