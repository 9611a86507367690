"""The rm strategy: registry, pooling, loss with margins, eval accuracy, a YAML run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from astrai_core.plugins import load_plugins
from astrai_core.testing import build_strategy, read_metrics
from astrai_plugin_rm.loss import bradley_terry_loss


def test_strategy_loads_by_name():
    from astrai_plugin_rm.strategy import RewardModeling

    assert load_plugins().get("strategy", "rm").load() is RewardModeling


def _direct_reward(strategy, ids, attention):
    """The score head on the last real token of one row, its padding cut off (no masks)."""
    ids = ids[attention.bool()]
    hidden = strategy.run.model(ids[None], return_hidden_states=True)["hidden_states"][0]
    return strategy.score(hidden[-1]).item()


def test_rewards_pool_the_last_real_token(tmp_path, pairs_file, rm_kit):
    strategy, _ = build_strategy(rm_kit.rm_config(tmp_path, pairs_file), tmp_path)
    batch = strategy.batch_source().next_step()[0]
    assert batch["chosen_attention_mask"].sum(1).ne(batch["chosen_attention_mask"].shape[1]).any()
    with torch.no_grad():
        chosen, rejected, _ = strategy.rewards(batch)
        for side, got in (("chosen", chosen), ("rejected", rejected)):
            for row in range(len(got)):
                expected = _direct_reward(strategy, batch[f"{side}_input_ids"][row],
                                          batch[f"{side}_attention_mask"][row])
                assert got[row].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
        # padding is told apart by the attention mask, whatever id fills it
        repadded = dict(batch)
        for side in ("chosen", "rejected"):
            ids = batch[f"{side}_input_ids"].clone()
            ids[batch[f"{side}_attention_mask"] == 0] = 11
            repadded[f"{side}_input_ids"] = ids
        again = strategy.rewards(repadded)
    torch.testing.assert_close(again[0], chosen)
    torch.testing.assert_close(again[1], rejected)


def test_loss_uses_the_margin_column_and_centring(tmp_path, rm_kit):
    data = rm_kit.write_pairs(tmp_path / "pairs.jsonl", margins=True)
    strategy, _ = build_strategy(rm_kit.rm_config(tmp_path, data, center_rewards_coefficient=0.3),
                                 tmp_path)
    batch = strategy.batch_source().next_step()[0]
    rows = [yaml.safe_load(line) for line in data.read_text().splitlines()][:8]
    assert batch["margin"].tolist() == pytest.approx([r["margin"] for r in rows])
    loss, metrics = strategy.compute_loss(batch)
    chosen, rejected, _ = strategy.rewards(batch)
    expected, _ = bradley_terry_loss(chosen, rejected, batch["margin"], 0.3)
    without, _ = bradley_terry_loss(chosen, rejected, None, 0.3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert abs(loss.item() - without.item()) > 1e-4  # the margins did change it
    assert metrics["loss_weight"] == 8
    assert metrics["accuracy"].item() == pytest.approx((chosen > rejected).float().mean().item())


def test_data_without_margins_has_no_margin_tensor(tmp_path, pairs_file, rm_kit):
    strategy, _ = build_strategy(rm_kit.rm_config(tmp_path, pairs_file), tmp_path)
    assert "margin" not in strategy.batch_source().next_step()[0]


def test_bad_margin_is_one_clear_error(tmp_path, rm_kit):
    data = rm_kit.write_pairs(tmp_path / "pairs.jsonl")
    lines = data.read_text().splitlines()
    lines[2] = lines[2][:-1] + ', "margin": "big"}'
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(Exception, match=r"line 3.*margin"):
        build_strategy(rm_kit.rm_config(tmp_path, data), tmp_path)


def test_trains_from_yaml_and_checkpoints_the_head(tmp_path, rm_kit):
    """`astrai train rm.yaml`: the held-out pair accuracy rises; the checkpoint scores alike."""
    train_pairs = rm_kit.write_pairs(tmp_path / "train.jsonl", count=64, seed=1, plain=True)
    eval_pairs = rm_kit.write_pairs(tmp_path / "eval.jsonl", count=32, seed=2, plain=True)
    config = rm_kit.rm_config(tmp_path, train_pairs, eval_pairs)
    config["trainer"].update(max_steps=40, lr=3e-3, eval_every=40, eval_at_start=True,
                             save_every=40)
    path = tmp_path / "rm.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    evals = [m for m in read_metrics(tmp_path / "run") if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 40]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    assert evals[-1]["eval/accuracy"] > 0.8  # the right sum is the shorter, digit-only one
    checkpoint = tmp_path / "run" / "checkpoints" / "step_40"
    assert (checkpoint / "score.safetensors").is_file()

    from astrai_plugin_rm.checkpoint import load_reward_model

    strategy, _ = build_strategy(rm_kit.rm_config(tmp_path / "again", eval_pairs), tmp_path)
    model, _ = load_reward_model(checkpoint)
    strategy.run.model.load_state_dict(model.backbone.state_dict())
    strategy.score.load_state_dict(model.score.state_dict())
    batch = strategy.batch_source().next_step()[0]
    with torch.no_grad():
        chosen, _, _ = strategy.rewards(batch)
        direct = model(batch["chosen_input_ids"], batch["chosen_attention_mask"])
    torch.testing.assert_close(direct, chosen)


def test_resume_restores_the_score_head_exactly(tmp_path, rm_kit):
    """A run stopped at step 2 and resumed ends where the uninterrupted run ends."""
    from safetensors.torch import load_file

    from astrai_core.config.schema import RunConfig
    from astrai_core.training.run import train

    data = rm_kit.write_pairs(tmp_path / "pairs.jsonl", count=32, margins=True)
    reference = rm_kit.rm_config(tmp_path, data, center_rewards_coefficient=0.1)
    reference["data"]["shuffle"] = True
    reference["trainer"].update(max_steps=4, save_every=2, lr=3e-3)
    reference["output_dir"] = str(tmp_path / "reference")
    train(RunConfig.model_validate(reference))
    interrupted = dict(reference, output_dir=str(tmp_path / "interrupted"))
    interrupted["trainer"] = dict(reference["trainer"], max_steps=2)
    train(RunConfig.model_validate(interrupted))
    interrupted["trainer"] = dict(reference["trainer"])
    train(RunConfig.model_validate(interrupted), resume=True)

    def head(run: str, step: int):
        return load_file(str(tmp_path / run / "checkpoints" / f"step_{step}" / "score.safetensors"))

    expected, got = head("reference", 4), head("interrupted", 4)
    torch.testing.assert_close(got["weight"], expected["weight"], rtol=0, atol=0)
    assert not torch.equal(head("reference", 2)["weight"], expected["weight"])  # it trained
