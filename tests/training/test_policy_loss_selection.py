"""The ``policy_loss:`` option: selected from YAML (built-in or an outside plugin's), built
once by the run wiring, checked before any work with file:line messages."""

from __future__ import annotations

import pytest
import torch
import yaml

from astrai_core.cli.main import main
from astrai_core.config.loader import load_config
from astrai_core.rl.policy_losses import GSPO, PPOClip
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.training.run import train
from tests.training.conftest import install_plugin

# A REINFORCE loss (-A * scale * log pi) from outside the repository, with a validated option.
PLUGIN = '''
from astrai_core import hookimpl, PolicyLossSpec

@hookimpl
def astrai_policy_losses():
    return [PolicyLossSpec(name="reinforce_test", target="pl_test_loss:Reinforce",
                           summary="plain REINFORCE, for a test")]
'''
LOSS = '''
import torch
from pydantic import BaseModel, ConfigDict, Field
from astrai_core.api import apply_rollout_weights

class Reinforce:
    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        scale: float = Field(1.0, gt=0)

    calls = 0

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, *, logprobs, old_logprobs, advantages, response_mask, **extras):
        Reinforce.calls += 1
        safe = torch.where(response_mask, logprobs, 0.0)
        per_token = -self.scale * advantages * safe
        metrics = {"reinforce/scale": torch.tensor(self.scale)}
        return apply_rollout_weights(per_token, response_mask, extras), metrics
'''


@pytest.fixture
def outside_loss(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "pl_test_plugin",
                   {"pl_test_plugin": PLUGIN, "pl_test_loss": LOSS})


def _yaml(tmp_path, strategy, **trainer):
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "prompts.jsonl"),
                             strategy, **trainer)
    config["data"]["batch_size"] = 4
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, config


def test_an_outside_policy_loss_selected_from_yaml_trains(tmp_path, outside_loss):
    path, _ = _yaml(tmp_path, {"name": "grpo", "group_size": 4,
                               "policy_loss": {"name": "reinforce_test", "scale": 0.5}},
                    max_steps=3)
    train(load_config(path), overwrite=True)
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["reinforce/scale"] == 0.5 for m in metrics)   # its metrics reach the log
    assert all("clip_fraction" not in m for m in metrics)       # ppo_clip was not used
    assert all(m["policy_loss"] != 0 for m in metrics)
    from pl_test_loss import Reinforce
    assert Reinforce.calls >= 3


def test_the_outside_loss_gradient_reaches_the_policy(tmp_path, outside_loss):
    _, config = _yaml(tmp_path, {"name": "ppo", "group_size": 4, "mini_batches": 1,
                                 "epochs": 1, "policy_loss": {"name": "reinforce_test"}})
    strategy, run = build_strategy(config, tmp_path)
    assert type(run.policy_loss).__name__ == "Reinforce" and run.policy_loss.scale == 1.0
    batch = strategy.batch_source().next_step()[0]
    batch.advantages = torch.where(batch.response_mask, 1.0, 0.0)
    loss, metrics = strategy.compute_loss(batch)
    loss.backward()
    assert metrics["reinforce/scale"].item() == 1.0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in run.model.parameters())


@pytest.mark.parametrize("strategy", ["grpo", "ppo"])
def test_builtin_choice_and_the_default(tmp_path, strategy):
    _, config = _yaml(tmp_path, {"name": strategy, "group_size": 4, "mini_batches": 1,
                                 "policy_loss": {"name": "gspo", "eps_high": 1e-3}})
    run = build_strategy(config, tmp_path)[1]
    assert isinstance(run.policy_loss, GSPO)
    assert (run.policy_loss.eps_low, run.policy_loss.eps_high) == (3e-4, 1e-3)
    _, config = _yaml(tmp_path, {"name": strategy, "group_size": 4, "mini_batches": 1,
                                 "clip_eps": 0.3})
    run = build_strategy(config, tmp_path)[1]
    assert type(run.policy_loss) is PPOClip
    assert (run.policy_loss.eps_low, run.policy_loss.eps_high) == (0.3, 0.3)


def _fails(path, capsys, monkeypatch) -> str:
    # main() would point structlog at capsys's stream, which closes with this test.
    monkeypatch.setattr("astrai_core.cli.main.configure_logging", lambda *a, **k: None)

    def never(*args, **kwargs):
        raise AssertionError("the model was built before the config was checked")
    monkeypatch.setattr("astrai_core.training.run.build_model", never)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_bad_policy_losses_fail_before_any_work_with_file_and_line(tmp_path, capsys,
                                                                 monkeypatch):
    path, _ = _yaml(tmp_path, {"name": "grpo", "policy_loss": {"name": "nope"}})
    err = _fails(path, capsys, monkeypatch)
    line = _line_of(path, "name: nope")
    assert f"run.yaml:{line}: strategy.policy_loss.name: unknown policy loss 'nope'" in err, err
    assert "ppo_clip" in err and not (tmp_path / "run").exists()

    path, _ = _yaml(tmp_path, {"name": "ppo", "policy_loss": {"name": "dual_clip", "c": 0.5}})
    err = _fails(path, capsys, monkeypatch)
    assert f"run.yaml:{_line_of(path, 'c: 0.5')}: strategy.policy_loss.c" in err, err
    assert "greater than 1" in err

    path, _ = _yaml(tmp_path, {"name": "grpo", "eps_high": 0.28,
                               "policy_loss": {"name": "cispo"}})
    err = _fails(path, capsys, monkeypatch)
    assert "eps_high configure the default ppo_clip loss" in err, err
    assert not (tmp_path / "run").exists()
