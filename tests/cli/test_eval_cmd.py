"""`astrai eval`: the accuracy of a GRPO checkpoint equals the run's final evaluation, and
pass@k is the unbiased estimator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from astrai_core.cli.main import main
from astrai_core.config.schema import RunConfig
from astrai_core.rollout.evaluate import pass_at_k
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.training.run import train

REWARD_MODULE = '''
def some_digits(prompts, completions, **columns):
    """A reward that varies on a random tiny model: the share of odd digits in the text."""
    return [sum(ch in "13579" for ch in c) / max(len(c), 1) for c in completions]
'''


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def test_pass_at_k_is_the_unbiased_estimator():
    scores = [1, 0, 0, 0] + [1, 1, 1, 1] + [0, 0, 0, 0]
    got = pass_at_k(scores, 4)
    assert got == pytest.approx({"eval/pass@1": (0.25 + 1 + 0) / 3,
                                 "eval/pass@2": (1 - 3 / 6 + 1 + 0) / 3,
                                 "eval/pass@4": (1 + 1 + 0) / 3})
    assert set(pass_at_k([1, 0, 1], 3)) == {"eval/pass@1", "eval/pass@2", "eval/pass@3"}


def _eval(capsys, *args: str) -> dict:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-format", "json", "eval", *args])
    assert exit_info.value.code == 0
    return json.loads(capsys.readouterr().out)


def test_eval_of_a_grpo_checkpoint_equals_the_runs_final_evaluation(tmp_path, capsys,
                                                                    monkeypatch):
    (tmp_path / "eval_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=12)
    rewards = [{"name": "exact_match"}, {"name": "eval_test_rewards:some_digits"}]
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             rewards=rewards, max_steps=3)
    config["data"]["eval"] = {"path": str(prompts), "format": "prompt"}
    train(RunConfig.model_validate(config))
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    got = _eval(capsys, str(tmp_path / "run" / "checkpoints" / "step_3"), "--data", str(prompts),
                "--rewards", "exact_match", "eval_test_rewards:some_digits",
                "--cache-dir", str(tmp_path / "cache"),
                "--out", str(tmp_path / "eval.json"))
    for name in ("eval/accuracy", "eval/reward", "eval/reward/some_digits",
                 "eval/response_length"):
        assert got[name] == final[name], name
    assert 0 < final["eval/reward/some_digits"] < 1  # the comparison is not trivial
    assert json.loads((tmp_path / "eval.json").read_text()) == got
    assert got["prompts"] == 12 and got["n"] == 1 and got["temperature"] == 0.0

    # under torchrun the prompts are shared out; the means agree up to summation order
    two = _torchrun_eval(tmp_path, str(tmp_path / "run" / "checkpoints" / "step_3"), "--data",
                         str(prompts), "--rewards", "exact_match", "eval_test_rewards:some_digits",
                         "--cache-dir", str(tmp_path / "cache"))
    assert two["processes"] == 2 and two["prompts"] == 12
    for name in ("eval/accuracy", "eval/reward", "eval/response_length"):
        assert two[name] == pytest.approx(got[name], abs=1e-12), name

    sampled = _eval(capsys, str(tmp_path / "run" / "checkpoints" / "step_3"), "--data",
                    str(prompts), "--rewards", "eval_test_rewards:some_digits", "--n", "4",
                    "--cache-dir", str(tmp_path / "cache"))
    assert sampled["temperature"] == 1.0
    assert {"eval/pass@1", "eval/pass@2", "eval/pass@4"} <= set(sampled)
    assert sampled["eval/accuracy"] == sampled["eval/reward/some_digits"]


def _torchrun_eval(tmp_path: Path, *args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "astrai_core.cli.main", "--log-format",
                           "json", "eval", *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def test_eval_refuses_greedy_with_several_samples(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(tmp_path), "--data", "x.jsonl", "--n", "4", "--temperature", "0"])
    assert exit_info.value.code == 2
    assert "--temperature: 0 (greedy) gives --n identical completions" in capsys.readouterr().err


def test_the_prompt_budget_is_what_the_context_leaves_after_the_generation():
    from astrai_core.cli.eval_cmd import prompt_budget
    from astrai_core.errors import ConfigError

    assert prompt_budget(None, 16, 128) == 112        # the default: context less generation
    assert prompt_budget(100, 16, 128) == 100         # an explicit limit that fits
    assert prompt_budget(None, 16, None) is None      # no context known: no limit of ours
    with pytest.raises(ConfigError, match="--max-prompt-len: 120 \\+ --max-new-tokens 16"):
        prompt_budget(120, 16, 128)
    with pytest.raises(ConfigError, match="--max-new-tokens: 128 generated tokens leave no room"):
        prompt_budget(None, 128, 128)
