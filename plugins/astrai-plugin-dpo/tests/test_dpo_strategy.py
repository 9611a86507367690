"""The dpo strategy: registry, sequence log-probs, loss formula, margin up, online pairs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import yaml

from astrai_core.config.loader import load_config
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.testing import (build_strategy, read_metrics, tiny_run_config,
                                 write_arith_prompts)
from astrai_core.training.run import train
from astrai_core.training.trainer import Trainer
from astrai_plugin_dpo.pairs import best_and_worst, dataset_pair_logprobs, pair_micro_batches


def test_strategy_loads_by_name():
    from astrai_plugin_dpo.strategy import DPO

    assert load_plugins().get("strategy", "dpo").load() is DPO


def _offline(tmp_path, pairs_file, **strategy):
    config = tiny_run_config(tmp_path, pairs_file, {"name": "dpo", **strategy},
                             data_format="preference", max_steps=8)
    config["data"]["shuffle"] = False
    return build_strategy(config, tmp_path)


def test_sequence_logprobs_cover_response_tokens_only(tmp_path, pairs_file, direct_logprob):
    strategy, ctx = _offline(tmp_path, pairs_file)
    batch = strategy.batch_source().next_step()[0]
    pairs = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    # The response and its <|end|> are the targets; the prompt and the template are not.
    for side in ("chosen", "rejected"):
        counts = batch[f"{side}_loss_mask"].sum(1).tolist()
        assert counts == [len(row[side]) + 1 for row in pairs]
    chosen, rejected, _, tokens = dataset_pair_logprobs(ctx.model, batch)
    assert tokens.item() == sum(len(r["chosen"]) + len(r["rejected"]) + 2 for r in pairs)
    for side, got in (("chosen", chosen), ("rejected", rejected)):
        for row in range(len(pairs)):
            expected = direct_logprob(ctx.model, batch[f"{side}_input_ids"][row],
                                                batch[f"{side}_attention_mask"][row],
                                                batch[f"{side}_loss_mask"][row])
            assert got[row].item() == pytest.approx(expected.item(), rel=1e-5)
    # Padding is read from the attention mask, never from a token id.
    repadded = dict(batch)
    for side in ("chosen", "rejected"):
        ids = batch[f"{side}_input_ids"].clone()
        ids[batch[f"{side}_attention_mask"] == 0] = 11
        repadded[f"{side}_input_ids"] = ids
    again = dataset_pair_logprobs(ctx.model, repadded)
    torch.testing.assert_close(again[0], chosen)
    torch.testing.assert_close(again[1], rejected)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
def test_loss_equals_the_formula(tmp_path, pairs_file, loss_type, direct_logprob):
    beta = 0.5
    strategy, ctx = _offline(tmp_path, pairs_file, beta=beta, loss_type=loss_type)
    with torch.no_grad():  # make the reference differ from the policy
        for param in strategy.reference.parameters():
            param.add_(0.1 * torch.randn_like(param))
    batch = strategy.batch_source().next_step()[0]
    loss, metrics = strategy.compute_loss(batch)

    def logps(model, side):
        return torch.stack([direct_logprob(
            model, batch[f"{side}_input_ids"][i], batch[f"{side}_attention_mask"][i],
            batch[f"{side}_loss_mask"][i]) for i in range(len(batch[f"{side}_input_ids"]))])
    with torch.no_grad():
        h = ((logps(ctx.model, "chosen") - logps(ctx.model, "rejected"))
             - (logps(strategy.reference, "chosen") - logps(strategy.reference, "rejected")))
    expected = {"sigmoid": -F.logsigmoid(beta * h), "ipo": (h - 1 / (2 * beta)) ** 2,
                "hinge": torch.relu(1 - beta * h)}[loss_type].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    assert metrics["margin"].item() == pytest.approx((beta * h).mean().item(), rel=1e-4, abs=1e-6)
    assert metrics["reward_accuracy"].item() == pytest.approx((h > 0).double().mean().item())


def test_offline_dpo_raises_the_margin(tmp_path, pairs_file):
    strategy, ctx = _offline(tmp_path, pairs_file)
    trainer = Trainer(ctx, strategy)
    trainer.fit()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    margins = [json.loads(line)["margin"] for line in lines if "margin" in line]
    assert len(margins) == 8
    assert margins[0] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the start
    ctx.model.eval()
    with torch.no_grad():
        _, metrics = strategy.compute_loss(next(iter(ctx.train_loader)))
    assert metrics["margin"].item() > 0.3, margins
    assert metrics["reward_accuracy"].item() == 1.0
    assert metrics["chosen_reward"].item() > metrics["rejected_reward"].item()


def _rollout(rewards, group_ids):
    n = len(rewards)
    present = torch.ones(n, 2, dtype=torch.bool)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=present,
        response_ids=torch.arange(n)[:, None].repeat(1, 2), response_mask=present,
        old_logprobs=torch.zeros(n, 2), rewards=torch.tensor(rewards), reward_components={},
        group_ids=torch.tensor(group_ids))


def test_online_pairs_are_best_and_worst_of_each_group():
    rollout = _rollout([0.0, 1.0, 0.5, 2.0, 2.0, 2.0, 3.0, -1.0, 3.0],
                       [0, 0, 0, 1, 1, 1, 2, 2, 2])
    chosen, rejected = best_and_worst(rollout)
    assert (chosen, rejected) == ([1, 6], [0, 7])  # group 1 ties: no preference
    first, second = pair_micro_batches(rollout, chosen, rejected, 2)
    assert first.response_ids[:, 0].tolist() == [1, 0]  # [chosen, rejected] of pair 0
    assert second.response_ids[:, 0].tolist() == [6, 7]


def test_online_dpo_raises_the_reward(tmp_path):
    # Reward: the completion contains a digit (~45% for the random tiny model).
    data = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, data, {"name": "dpo", "mode": "online", "beta": 0.5},
                             max_steps=8, lr=2e-2)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    train(load_config(path))
    metrics = [m for m in read_metrics(tmp_path / "run") if "rollout/reward_mean" in m]
    assert len(metrics) == 8 and all(m["rollout/pairs"] >= 1 for m in metrics)
    first = metrics[0]["rollout/reward_mean"]
    last = sum(m["rollout/reward_mean"] for m in metrics[-3:]) / 3
    assert last > first + 0.2, (first, last)


def test_label_smoothing_needs_the_sigmoid_loss(tmp_path, pairs_file):
    config = tiny_run_config(tmp_path, pairs_file, {
        "name": "dpo", "loss_type": "ipo", "label_smoothing": 0.1}, data_format="preference")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"strategy.*label_smoothing applies to loss_type"):
        train(load_config(path))
