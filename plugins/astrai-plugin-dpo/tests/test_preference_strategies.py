"""The simpo loss of dpo, and the kto and orpo strategies, on tiny models: registry, the loss
equal to its formula over independently computed log-probs, no reference where none is
needed, config errors, and short training runs from YAML."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from astrai_core.config.loader import load_config
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config
from astrai_core.training.run import train
from astrai_plugin_dpo.kto import mismatched_batch
from astrai_plugin_dpo.losses import kto_kl_estimate


def _build(tmp_path, data, strategy, data_format, **trainer):
    config = tiny_run_config(tmp_path, data, strategy, data_format=data_format, **trainer)
    config["data"]["shuffle"] = False
    return build_strategy(config, tmp_path)


def _perturb(module, scale=0.1, seed=0):
    """Make a frozen reference differ from the policy."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))


def _side(direct_logprob, model, batch, prefix=""):
    """(summed log-probs [B], response token counts [B]) of one side of a batch."""
    rows = range(batch[f"{prefix}input_ids"].shape[0])
    with torch.no_grad():
        sums = torch.stack([direct_logprob(model, batch[f"{prefix}input_ids"][i],
                                           batch[f"{prefix}attention_mask"][i],
                                           batch[f"{prefix}loss_mask"][i]) for i in rows])
    return sums, batch[f"{prefix}loss_mask"].sum(-1).double()


def test_kto_and_orpo_load_by_name():
    from astrai_plugin_dpo.kto import KTO
    from astrai_plugin_dpo.orpo import ORPO

    registry = load_plugins()
    assert registry.get("strategy", "kto").load() is KTO
    assert registry.get("strategy", "orpo").load() is ORPO
    for name in ("dpo", "kto", "orpo"):
        assert registry.provider("strategy", name).distribution == "astrai-plugin-dpo"


# ---------------------------------------------------------------- simpo


def test_simpo_holds_no_reference_and_its_loss_equals_the_formula(tmp_path, pairs_file,
                                                                  direct_logprob):
    beta, gamma = 2.0, 0.7
    strategy, ctx = _build(tmp_path, pairs_file, {"name": "dpo", "loss_type": "simpo",
                                                  "beta": beta, "gamma": gamma}, "preference")
    assert strategy.reference is None and strategy.frozen_modules() == {}
    batch = strategy.batch_source().next_step()[0]
    loss, metrics = strategy.compute_loss(batch)
    chosen, chosen_len = _side(direct_logprob, ctx.model, batch, "chosen_")
    rejected, rejected_len = _side(direct_logprob, ctx.model, batch, "rejected_")
    pairs = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    assert chosen_len.tolist() == [len(p["chosen"]) + 1 for p in pairs]  # the answer, <|end|>
    z = beta * (chosen / chosen_len - rejected / rejected_len) - gamma
    assert loss.item() == pytest.approx(-F.logsigmoid(z).mean().item(), rel=1e-5)
    assert metrics["margin"].item() == pytest.approx(
        (beta * (chosen / chosen_len - rejected / rejected_len)).mean().item(), rel=1e-4)
    loss.backward()  # the policy gets a gradient (there is nothing else to train)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in ctx.model.parameters())


@pytest.mark.parametrize("strategy, message", [
    ({"name": "dpo", "gamma": 1.0}, "gamma is the margin of loss_type simpo"),
    ({"name": "dpo", "loss_type": "hinge", "label_smoothing": 0.1},
     "label_smoothing applies to loss_type sigmoid and simpo"),
])
def test_dpo_options_of_another_loss_are_config_errors(tmp_path, pairs_file, strategy, message):
    config = tiny_run_config(tmp_path, pairs_file, strategy, data_format="preference")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=message):
        train(load_config(path))


# ---------------------------------------------------------------- orpo


def test_orpo_loss_equals_the_formula(tmp_path, pairs_file, direct_logprob):
    beta = 0.3
    strategy, ctx = _build(tmp_path, pairs_file, {"name": "orpo", "beta": beta}, "preference")
    assert strategy.frozen_modules() == {}
    batch = strategy.batch_source().next_step()[0]
    loss, metrics = strategy.compute_loss(batch)
    chosen, chosen_len = _side(direct_logprob, ctx.model, batch, "chosen_")
    rejected, rejected_len = _side(direct_logprob, ctx.model, batch, "rejected_")
    nll = -(chosen / chosen_len).mean()  # each chosen response's per-token NLL, over pairs

    def log_odds(avg):
        return avg - torch.log1p(-torch.exp(avg))

    ratio = log_odds(chosen / chosen_len) - log_odds(rejected / rejected_len)
    expected = nll - beta * F.logsigmoid(ratio).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["nll"].item() == pytest.approx(nll.item(), rel=1e-5)
    assert metrics["log_odds_ratio"].item() == pytest.approx(ratio.mean().item(), rel=1e-4,
                                                             abs=1e-6)


# ---------------------------------------------------------------- kto


def test_mismatched_batch_pairs_each_prompt_with_the_previous_completion():
    # rows: prompt [5, 6] + completion [7, 8]; prompt [9] + completion [10]; prompt [11, 12, 13]
    # + completion [14] (right-padded; pad id 0)
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 0], [9, 10, 0, 0, 0], [11, 12, 13, 14, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]),
        "loss_mask": torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 0, 1, 0]]).bool(),
    }
    out = mismatched_batch(batch)
    rows = [out["input_ids"][b][out["attention_mask"][b].bool()].tolist() for b in range(3)]
    assert rows == [[5, 6, 14], [9, 7, 8], [11, 12, 13, 10]]
    targets = [out["input_ids"][b][out["loss_mask"][b]].tolist() for b in range(3)]
    assert targets == [[14], [7, 8], [10]]
    assert out["position_ids"][0].tolist() == [0, 1, 2, 3]


class _TwoProcesses:
    """Process ``rank`` of two (or of ``len(shares)``, in context groups of
    ``context_size`` that hold the same rows) whose shares of a global micro-batch are
    ``shares``."""

    enabled = True

    def __init__(self, rank, shares, sums=None, context_size=1):
        self.rank, self.shares, self.sums = rank, shares, sums
        self.world_size, self.context_size = max(len(shares), 2), context_size
        self.data_rank = rank // context_size

    def all_gather_object(self, obj):
        assert obj == self.shares[self.rank]
        return self.shares

    def all_reduce_sum(self, values):
        return [a + b for a, b in zip(values, self.sums)]


def test_mismatched_batch_pairs_rows_across_processes_as_one_process_would():
    # the global micro-batch [prompt 5 + 7, prompt 6 + 8 9, prompt 10 + 11] split 2 + 1 rows:
    # one process pairs 5 with 11, 6 with 7, 10 with 8 9; the two shares must say the same
    def batch(rows, prompt_lengths):
        width = max(map(len, rows))
        return {"input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
                "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r))
                                                for r in rows]),
                "loss_mask": torch.tensor([[0] * n + [1] * (len(r) - n) + [0] * (width - len(r))
                                           for r, n in zip(rows, prompt_lengths)]).bool()}

    def texts(out):
        return [out["input_ids"][b][out["attention_mask"][b].bool()].tolist()
                for b in range(out["input_ids"].shape[0])]

    whole = texts(mismatched_batch(batch([[5, 7], [6, 8, 9], [10, 11]], [1, 1, 1])))
    assert whole == [[5, 11], [6, 7], [10, 8, 9]]
    shares = [[[7], [8, 9]], [[11]]]
    first = mismatched_batch(batch([[5, 7], [6, 8, 9]], [1, 1]), _TwoProcesses(0, shares))
    second = mismatched_batch(batch([[10, 11]], [1]), _TwoProcesses(1, shares))
    assert texts(first) + texts(second) == whole
    # 4 processes in 2 context groups of 2: each group's ranks hold the same rows
    grouped = [shares[0], shares[0], shares[1], shares[1]]
    for rank in range(4):
        rows = ([[5, 7], [6, 8, 9]], [1, 1]) if rank < 2 else ([[10, 11]], [1])
        out = mismatched_batch(batch(*rows), _TwoProcesses(rank, grouped, context_size=2))
        assert texts(out) == (whole[:2] if rank < 2 else whole[2:])


def test_kto_reference_point_is_the_global_batch_mean():
    # one process: mean of [0.5, 0.1, 0.9] = 0.5; two processes see [0.5, 0.1] and [0.9]
    policy, reference = torch.tensor([-2.0, -3.0]), torch.tensor([-2.5, -3.1])
    other = [0.9, 1.0]  # the other process's sum and count
    kl = kto_kl_estimate(policy, reference, all_reduce_sum=_TwoProcesses(0, [], other)
                         .all_reduce_sum)
    assert kl.item() == pytest.approx(0.5)
    alone = kto_kl_estimate(torch.tensor([-2.0, -3.0, -1.0]), torch.tensor([-2.5, -3.1, -1.9]))
    assert alone.item() == pytest.approx(kl.item())


def test_kto_loss_equals_the_formula(tmp_path, unpaired_file, direct_logprob):
    beta, w_d, w_u = 0.5, 1.4, 0.6
    strategy, ctx = _build(tmp_path, unpaired_file, {
        "name": "kto", "beta": beta, "desirable_weight": w_d, "undesirable_weight": w_u},
        "unpaired")
    _perturb(strategy.reference, 0.05)  # policy and reference differ, with z0 > 0
    batch = strategy.batch_source().next_step()[0]
    loss, metrics = strategy.compute_loss(batch)

    rows = [json.loads(line) for line in unpaired_file.read_text().splitlines()]
    assert batch["label"].tolist() == [row["label"] for row in rows]
    policy, _ = _side(direct_logprob, ctx.model, batch)
    reference, _ = _side(direct_logprob, strategy.reference, batch)
    # mismatched pairs from the raw rows: prompt i, completion i - 1 (the tokenizer is
    # character-level, so the text's tokens are the concatenation, then <|end|>)
    tokenizer = ctx.tokenizer
    kl_terms = []
    for i, row in enumerate(rows):
        completion = rows[i - 1]["completion"]
        ids = torch.tensor(tokenizer(row["prompt"] + completion)["input_ids"]
                           + [tokenizer.eos_token_id])
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[-(len(completion) + 1):] = True
        with torch.no_grad():
            kl_terms.append(direct_logprob(ctx.model, ids, torch.ones_like(ids), mask)
                            - direct_logprob(strategy.reference, ids, torch.ones_like(ids), mask))
    z0 = max(0.0, torch.stack(kl_terms).mean().item())
    assert z0 > 0  # the clamp is not what makes the formula hold
    losses = []
    for r, label in zip((policy - reference).tolist(), batch["label"].tolist()):
        losses.append(w_d * (1 - 1 / (1 + math.exp(-beta * (r - z0)))) if label
                      else w_u * (1 - 1 / (1 + math.exp(-beta * (z0 - r)))))
    assert metrics["kl"].item() == pytest.approx(z0, rel=1e-4)
    assert loss.item() == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_kto_needs_two_rows_per_batch(tmp_path, unpaired_file):
    config = tiny_run_config(tmp_path, unpaired_file, {"name": "kto"}, data_format="unpaired",
                             data={"batch_size": 1})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"data.batch_size.*at least 2 rows"):
        train(load_config(path))


def _kto_batch_loss(rows, policy, reference, tokenizer, direct_logprob, beta, w_d, w_u):
    """(KTO's loss, response tokens) of one batch of unpaired rows, row by row: each row
    tokenised as prompt + completion + <|end|>, z0 from row i's prompt with row i-1's
    completion (cyclically: a batch of one row pairs it with itself)."""
    def logratio(prompt, completion):
        ids = torch.tensor(tokenizer(prompt + completion)["input_ids"] + [tokenizer.eos_token_id])
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[-(len(completion) + 1):] = True
        with torch.no_grad():
            return (direct_logprob(policy, ids, torch.ones_like(ids), mask)
                    - direct_logprob(reference, ids, torch.ones_like(ids), mask)).item()

    z0 = max(0.0, sum(logratio(row["prompt"], rows[i - 1]["completion"])
                      for i, row in enumerate(rows)) / len(rows))
    losses = []
    for row in rows:
        r = logratio(row["prompt"], row["completion"])
        losses.append(w_d * (1 - 1 / (1 + math.exp(-beta * (r - z0)))) if row["label"]
                      else w_u * (1 - 1 / (1 + math.exp(-beta * (z0 - r)))))
    return sum(losses) / len(losses), sum(len(row["completion"]) + 1 for row in rows)


def test_kto_evaluates_unpaired_data_whose_last_batch_has_one_row(tmp_path, unpaired_file,
                                                                  direct_logprob):
    """eval/loss over batches of 2 rows and then 1 (paired with itself) is the
    token-weighted mean of the per-row reference losses of each batch."""
    from astrai_core.training.trainer import Trainer

    beta, w_d, w_u = 0.5, 1.4, 0.6
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(unpaired_file.read_text().splitlines(keepends=True)[:3]))
    config = tiny_run_config(tmp_path, unpaired_file, {
        "name": "kto", "beta": beta, "desirable_weight": w_d, "undesirable_weight": w_u},
        data_format="unpaired", max_steps=2, eval_every=2, lr=1e-2)
    config["data"].update(eval={"path": str(eval_file), "format": "unpaired"},
                          eval_batch_size=2, shuffle=False)  # batches of 2 rows, then 1
    strategy, run = build_strategy(config, tmp_path)
    Trainer(run, strategy).fit()  # evaluates after its last step: with the final weights
    losses = [m["eval/loss"] for m in read_metrics(tmp_path / "run") if "eval/loss" in m]
    assert len(losses) == 1
    rows = [json.loads(line) for line in eval_file.read_text().splitlines()]
    batches = [_kto_batch_loss(part, run.model.eval(), strategy.reference, run.tokenizer,
                               direct_logprob, beta, w_d, w_u) for part in (rows[:2], rows[2:])]
    expected = sum(loss * tokens for loss, tokens in batches) / sum(t for _, t in batches)
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert abs(batches[1][0] - batches[0][0]) > 1e-3  # the one-row batch's weight counts


def test_kto_refuses_preference_data(tmp_path, pairs_file):
    config = tiny_run_config(tmp_path, pairs_file, {"name": "kto"}, data_format="preference")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="unpaired"):
        train(load_config(path))


def test_kto_with_lora_uses_the_disabled_adapter_as_reference(tmp_path, unpaired_file):
    from astrai_core.model.lora import DisabledAdapterReference

    config = tiny_run_config(tmp_path, unpaired_file, {"name": "kto", "beta": 0.5},
                             data_format="unpaired")
    config["model"]["lora"] = {"r": 4, "alpha": 8.0}
    strategy, ctx = build_strategy(config, tmp_path)
    assert isinstance(strategy.reference, DisabledAdapterReference)
    assert list(strategy.reference.parameters()) == []
    loss, metrics = strategy.compute_loss(strategy.batch_source().next_step()[0])
    # a zero adapter: policy == reference, so r = 0, z0 = 0 and each loss is w * (1 - 1/2)
    assert loss.item() == pytest.approx(0.5, abs=1e-6)
    assert metrics["kl"].item() == 0.0


# ---------------------------------------------------------------- training from YAML


@pytest.mark.parametrize("strategy, data_format, rising", [
    ({"name": "kto", "beta": 0.5}, "unpaired", "reward_gap"),
    ({"name": "orpo", "beta": 0.5}, "preference", "margin"),
    ({"name": "dpo", "loss_type": "simpo", "beta": 2.0, "gamma": 0.5}, "preference", "margin"),
])
def test_trains_from_yaml_and_separates_good_from_bad(tmp_path, pairs_file, unpaired_file,
                                                      strategy, data_format, rising):
    data = unpaired_file if data_format == "unpaired" else pairs_file
    config = tiny_run_config(tmp_path, data, strategy, data_format=data_format, max_steps=8)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    train(load_config(path))
    metrics = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert len(metrics) == 8 and all(math.isfinite(m["loss"]) for m in metrics)

    def gap(m):
        return m["chosen_reward"] - m["rejected_reward"] if rising == "reward_gap" else m[rising]

    assert gap(metrics[-1]) > gap(metrics[0]) + 0.05, [gap(m) for m in metrics]
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert (tmp_path / "run" / "checkpoints").is_dir()


def _best_and_worst(rollout) -> tuple[list[int], list[int]]:
    """Each group's first best-reward row and its first worst, groups that tie skipped."""
    groups, rewards = rollout.group_ids.tolist(), rollout.rewards.tolist()
    chosen, rejected = [], []
    for group in dict.fromkeys(groups):
        rows = [i for i, g in enumerate(groups) if g == group]
        values = [rewards[i] for i in rows]
        if max(values) != min(values):
            chosen.append(rows[values.index(max(values))])
            rejected.append(rows[values.index(min(values))])
    return chosen, rejected


def _online_pair_loss(strategy: dict, model, rollout) -> float:
    """ORPO's or SimPO's loss over a rollout's best-and-worst pairs, from per-row unpadded
    float64 log-probs."""
    from astrai_core.testing import reference_token_logprobs

    chosen, rejected = _best_and_worst(rollout)
    with torch.no_grad():
        logps = reference_token_logprobs(model, rollout)
    average = torch.stack([logp.mean() for logp in logps])
    avg_c, avg_r = average[chosen], average[rejected]
    if strategy["name"] == "orpo":
        def log_odds(avg):
            return avg - torch.log1p(-torch.exp(avg))

        odds = -strategy["beta"] * F.logsigmoid(log_odds(avg_c) - log_odds(avg_r))
        return (-avg_c + odds).mean().item()
    z = strategy["beta"] * (avg_c - avg_r) - strategy["gamma"]
    return -F.logsigmoid(z).mean().item()


@pytest.mark.parametrize("strategy", [{"name": "orpo", "beta": 0.3},
                                      {"name": "dpo", "loss_type": "simpo", "beta": 2.0,
                                       "gamma": 0.5}])
def test_online_pairs_train(tmp_path, strategy):
    """Each step's loss is the formula over its rollout's best and worst completions, under
    the weights that sampled it, and each step lowers the loss of the pairs it trained on."""
    from astrai_core.testing import fit_recording_rollouts, write_arith_prompts

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {**strategy, "mode": "online", "group_size": 4},
                             max_steps=2, sampler={"temperature": 1.5, "max_new_tokens": 8})
    config["data"]["batch_size"] = 4
    built, run = build_strategy(config, tmp_path)
    drawn = fit_recording_rollouts(built, run)  # (rollout, the policy that sampled it)
    metrics = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert len(metrics) == 2 and all(m["rollout/pairs"] >= 1 for m in metrics)
    used = [drawn[step + sum(m["rollout/skipped"] for m in metrics[:step + 1])]
            for step in range(2)]  # the rollouts the two steps trained on
    after = [used[1][1], run.model.eval()]
    lengths = used[0][0].response_mask.sum(-1)
    chosen, rejected = _best_and_worst(used[0][0])
    assert (lengths[chosen] != lengths[rejected]).any()  # the length normalisation counts
    for step, (rollout, before) in enumerate(used):
        assert metrics[step]["loss"] == pytest.approx(
            _online_pair_loss(strategy, before, rollout), rel=1e-5)
        assert (_online_pair_loss(strategy, after[step], rollout)
                < _online_pair_loss(strategy, before, rollout))


def test_online_pairs_refuse_stale_rollouts(tmp_path):
    from astrai_core.testing import write_arith_prompts

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "orpo", "mode": "online"})
    config["rollout"] = {"max_staleness": 1}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="rollout.max_staleness.*online orpo pairs"):
        train(load_config(path))


def test_online_pairs_split_over_context_groups_need_prompts_for_every_process(tmp_path,
                                                                              monkeypatch):
    from astrai_core.config.plan import plan_run
    from astrai_core.config.schema import RunConfig
    from astrai_core.testing import write_arith_prompts

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "dpo", "mode": "online"})
    config["data"]["batch_size"] = 2
    config["parallel"] = {"context_parallel": 2}
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan_run(RunConfig.model_validate(config), base_dir=tmp_path)  # a share each
    monkeypatch.setenv("WORLD_SIZE", "4")  # 2 context groups: 4 processes sample
    with pytest.raises(ConfigError, match="data.batch_size: 2 prompts per rollout cannot "
                       "be split evenly over the 4 processes"):
        plan_run(RunConfig.model_validate(config), base_dir=tmp_path)
