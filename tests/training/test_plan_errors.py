"""The run plan checks a config whole before any work: each mistake below ends `astrai train`
with exit status 2 and ONE stderr line `error: FILE:LINE: dotted.path: message`, the model
is never built and `output_dir` is never created."""

from __future__ import annotations

import re

import pytest
import structlog
import yaml

from astrai_core.cli.main import main
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.training import run as run_module

MISSPELT_HOOK = '''
from astrai_core import StrategySpec, hookimpl

@hookimpl
def astrai_strategys():
    return [StrategySpec(name="plan_test_strategy", target="json:dumps", summary="never registered")]
'''

MISSING_ATTRIBUTE = '''
from astrai_core import StrategySpec, hookimpl

@hookimpl
def astrai_strategies():
    return [StrategySpec(name="plan_test_strategy", target="plan_test_targets:Reinforce",
                         summary="points at a class the module lacks")]
'''


@pytest.fixture(autouse=True)
def _logging_restored():
    """main() points structlog at this test's captured stderr; later tests need their own."""
    yield
    structlog.reset_defaults()


def _config(tmp_path, strategy=None, data_format="prompt", **overrides):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, strategy or {"name": "grpo", "group_size": 2},
                             data_format=data_format)
    for dotted, value in overrides.items():
        node = config
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return config


def _fails(tmp_path, config, capsys, monkeypatch) -> tuple[str, int]:
    """Run `astrai train` in-process; returns (the one error line, its line number)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    def never(*args, **kwargs):
        raise AssertionError("the model was built before the config was checked")
    monkeypatch.setattr(run_module, "build_model", never)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-format", "json", "train", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    match = re.match(rf"error: {re.escape(str(path))}:(\d+): ", lines[0])
    assert match, lines[0]
    assert not (tmp_path / "run").exists(), "output_dir was created"
    return lines[0], int(match.group(1))


def _line_of(path_text: str, needle: str) -> int:
    return next(i for i, line in enumerate(path_text.splitlines(), 1) if needle in line)


def test_a_misspelt_data_key(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path)
    config["data"]["bach_size"] = 8
    line, number = _fails(tmp_path, config, capsys, monkeypatch)
    assert "data.bach_size: unknown field" in line
    assert number == _line_of((tmp_path / "run.yaml").read_text(), "bach_size")


def test_a_data_value_of_the_wrong_type(tmp_path, capsys, monkeypatch):
    line, _ = _fails(tmp_path, _config(tmp_path, data__batch_size="eight"), capsys, monkeypatch)
    assert "data.batch_size: Input should be a valid integer" in line


def test_an_unknown_data_format(tmp_path, capsys, monkeypatch):
    line, _ = _fails(tmp_path, _config(tmp_path, data__sources__0__format="chatt"), capsys,
                     monkeypatch)
    assert "data.sources.0.format: Input should be" in line


def test_a_reward_option_typo(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path)
    config["rewards"] = [{"name": "format_regex", "patern": "[0-9]"}]
    line, _ = _fails(tmp_path, config, capsys, monkeypatch)
    assert "rewards.0.patern: unknown field" in line
    assert "https://" not in line  # no raw pydantic dump


def test_an_unknown_reward_name_with_its_line(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path)
    config["rewards"] = [{"name": "exact_match"}, {"name": "exact_mtach"}]
    line, number = _fails(tmp_path, config, capsys, monkeypatch)
    assert "rewards.1.name: unknown reward function 'exact_mtach'" in line
    assert "exact_match" in line  # the available names
    assert number == _line_of((tmp_path / "run.yaml").read_text(), "exact_mtach")


def test_an_online_batch_that_micro_batches_cannot_split(tmp_path, capsys, monkeypatch):
    # 8 prompts x 3 completions = 24 sequences: not 2 mini-batches x 5 micro-batches
    config = _config(tmp_path, {"name": "grpo", "group_size": 3, "mini_batches": 2},
                     trainer__grad_accum_steps=5)
    line, _ = _fails(tmp_path, config, capsys, monkeypatch)
    assert "trainer.grad_accum_steps: a rollout of 24 sequences" in line
    assert "strategy.mini_batches=2 x trainer.grad_accum_steps=5" in line


def test_an_online_strategy_given_sft_data(tmp_path, capsys, monkeypatch):
    line, _ = _fails(tmp_path, _config(tmp_path, data__sources__0__format="chat"), capsys,
                     monkeypatch)
    assert "data.sources.0.format: strategy 'grpo' trains on prompt data, not 'chat'" in line


def test_an_eval_format_the_strategy_cannot_score(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path)
    config["data"]["eval"] = {"path": str(tmp_path / "prompts.jsonl"), "format": "chat"}
    line, _ = _fails(tmp_path, config, capsys, monkeypatch)
    assert "data.eval.format: strategy 'grpo' evaluates prompt data, not 'chat'" in line


def test_a_critic_estimator_for_a_strategy_without_a_critic(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path)
    config["advantage"] = {"name": "gae"}
    line, _ = _fails(tmp_path, config, capsys, monkeypatch)
    assert "advantage.name: advantage estimator 'gae' needs a value critic" in line


def test_a_reward_column_the_data_does_not_declare(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path, rewards=[{"name": "exact_match"}])
    config["data"]["sources"][0]["columns"] = ["question"]
    line, _ = _fails(tmp_path, config, capsys, monkeypatch)
    assert "rewards.0.name: reward 'exact_match' needs column(s) answer" in line


def _plugin(tmp_path, monkeypatch, name: str, text: str) -> None:
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ASTRAI_PLUGINS", name)


def test_a_plugin_whose_hook_name_is_misspelt(tmp_path, capsys, monkeypatch):
    _plugin(tmp_path, monkeypatch, "plan_test_misspelt", MISSPELT_HOOK)
    line, _ = _fails(tmp_path, _config(tmp_path, {"name": "plan_test_strategy"}), capsys, monkeypatch)
    assert "strategy.name: unknown strategy 'plan_test_strategy'" in line
    assert "plan_test_misspelt (RuntimeError: unknown hook astrai_strategys" in line


def test_a_spec_target_pointing_at_a_missing_attribute(tmp_path, capsys, monkeypatch):
    (tmp_path / "plan_test_targets.py").write_text("class Other:\n    pass\n")
    _plugin(tmp_path, monkeypatch, "plan_test_missing", MISSING_ATTRIBUTE)
    line, _ = _fails(tmp_path, _config(tmp_path, {"name": "plan_test_strategy"}), capsys, monkeypatch)
    assert "strategy.name: plugin 'plan_test_missing'" in line
    assert "target 'plan_test_targets:Reinforce' cannot be loaded (AttributeError" in line


def test_a_strategy_that_does_not_extend_the_base(tmp_path, capsys, monkeypatch):
    (tmp_path / "plan_test_bare.py").write_text(
        "class Reinforce:\n    def compute_loss(self, batch):\n        return 0, {}\n")
    _plugin(tmp_path, monkeypatch, "plan_test_bare_plugin",
            MISSING_ATTRIBUTE.replace("plan_test_targets", "plan_test_bare"))
    line, _ = _fails(tmp_path, _config(tmp_path, {"name": "plan_test_strategy"}), capsys, monkeypatch)
    assert "target 'plan_test_bare:Reinforce' lacks Config, needs, check_run" in line


def test_a_logprob_limit_for_an_offline_strategy(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path, {"name": "sft"}, data_format="chat",
                     rollout={"max_logprob_diff": 0.01})
    line, number = _fails(tmp_path, config, capsys, monkeypatch)
    assert "rollout.max_logprob_diff: strategy 'sft' trains offline" in line
    assert number == _line_of((tmp_path / "run.yaml").read_text(), "max_logprob_diff")


def test_a_logprob_limit_with_stale_rollouts(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path, rollout={"max_logprob_diff": 0.01, "max_staleness": 1})
    line, _ = _fails(tmp_path, config, capsys, monkeypatch)
    assert "rollout.max_logprob_diff: with rollout.max_staleness > 0" in line
