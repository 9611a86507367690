"""Error paths of training runs, from a config as a user meets them: one clear message and
its exit status, and nothing half-written. Two go through the `astrai train` command (the
exit status and a clean stderr); the others through ``train(load_config(path))``, which
that command runs, to save a process start each."""

from __future__ import annotations

import os
import textwrap

import pytest
import yaml

from astrai_core.testing import run_astrai, tiny_run_config, write_arith_prompts
from tests.training.reference import save_start_model, text_run_config, write_texts


def _train(tmp_path, config, *extra):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return run_astrai("train", str(path), *extra)


def _error(result, code: int = 2) -> str:
    """The one error line of a failed command (checked to be clean)."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def _train_in_process(tmp_path, config):
    """The error ``train(load_config(path))`` raises; the CLI prints it and exits with its code."""
    from astrai_core.config.loader import load_config
    from astrai_core.errors import AstraiError
    from astrai_core.training.run import train

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(AstraiError) as raised:
        train(load_config(path))
    assert raised.value.exit_code == 2
    return f"error: {raised.value}"


def _prompt_run(tmp_path, strategy, **trainer):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    return tiny_run_config(tmp_path, prompts, strategy, **trainer)


def test_divergence_stops_with_the_step_and_the_last_good_checkpoint(tmp_path):
    start = save_start_model(tmp_path / "start")
    # lr 1e30: the first AdamW step moves every weight by ~1e30, the next forward overflows
    config = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                             max_steps=4, lr=1e30, save_every=1)
    message = _error(_train(tmp_path, config), code=3)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_1"
    assert message.startswith("error: training diverged at step 2: "), message
    assert ("loss is nan" in message or "loss is inf" in message
            or "gradient norm is" in message), message
    assert f"the last good checkpoint is {checkpoint}" in message, message
    assert "Lower trainer.lr" in message
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step_1"]  # nothing for step 2


def test_grpo_rollout_that_cannot_be_cut_into_micro_batches(tmp_path):
    # 2 prompts x 2 completions = 4 samples: not 3 equal micro-batches (the run plan's check)
    config = _prompt_run(tmp_path, {"name": "grpo", "group_size": 2}, grad_accum_steps=3)
    config["data"]["batch_size"] = 2
    message = _train_in_process(tmp_path, config)
    assert message == ("error: trainer.grad_accum_steps: a rollout of 4 sequences "
                       "(data.batch_size=2 x strategy.group_size=2) cannot be cut into "
                       "strategy.mini_batches=1 x trainer.grad_accum_steps=3 equal "
                       "micro-batches")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_grpo_mini_batches_cut_below_the_accumulation(tmp_path):
    # 8 samples in 4 mini-batches of 2, each to be cut into 3 micro-batches
    config = _prompt_run(tmp_path, {"name": "grpo", "group_size": 2, "mini_batches": 4},
                         grad_accum_steps=3)
    config["data"]["batch_size"] = 4
    message = _train_in_process(tmp_path, config)
    assert message.startswith("error: trainer.grad_accum_steps: a rollout of 8 sequences "
                              "(data.batch_size=4 x strategy.group_size=2) cannot be cut into "
                              "strategy.mini_batches=4 x trainer.grad_accum_steps=3"), message


def test_online_dpo_gives_up_after_n_rollouts_without_pairs(tmp_path):
    # every completion matches ".*", so every group ties and no rollout gives a pair
    config = _prompt_run(tmp_path, {"name": "dpo", "mode": "online", "group_size": 2,
                                    "max_skipped_rollouts": 3})
    config["rewards"] = [{"name": "format_regex", "pattern": ".*"}]
    message = _train_in_process(tmp_path, config)
    assert message.startswith("error: 3 rollouts in a row gave fewer than "
                              "trainer.grad_accum_steps=1 preference pairs"), message
    assert "raise the sampler temperature or strategy.group_size" in message


def test_grpo_refuses_an_estimator_that_needs_values(tmp_path):
    config = _prompt_run(tmp_path, {"name": "grpo", "group_size": 2})
    config["advantage"] = {"name": "gae"}
    message = _train_in_process(tmp_path, config)
    assert message.startswith("error: advantage.name: advantage estimator 'gae' needs a "
                              "value critic, which strategy 'grpo' does not train"), message
    assert not (tmp_path / "run" / "checkpoints").exists()


# An online strategy a plugin author might write: it never builds a reference model.
_NO_REFERENCE_PLUGIN = '''
from astrai_core import StrategySpec, hookimpl
from astrai_core.api import OnlineStrategy


class NoReference(OnlineStrategy):
    def compute_loss(self, batch):
        raise AssertionError("the rollout should have been refused before any loss")


@hookimpl
def astrai_strategies():
    return [StrategySpec(name="no_reference", target="no_reference_plugin:NoReference",
                         summary="online strategy without a reference model")]
'''


def test_kl_reward_shaping_without_a_reference_model(tmp_path, monkeypatch):
    (tmp_path / "no_reference_plugin.py").write_text(textwrap.dedent(_NO_REFERENCE_PLUGIN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("ASTRAI_PLUGINS", "no_reference_plugin")
    config = _prompt_run(tmp_path, {"name": "no_reference", "group_size": 2,
                                    "kl_in_reward_coef": 0.1})
    config["advantage"] = {"name": "grpo"}
    message = _error(_train(tmp_path, config))
    assert message == "error: strategy.kl_in_reward_coef needs a reference model"
