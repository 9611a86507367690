"""The code example's data, and GRPO with code_tests: the rollout's rewards are the
sandboxed tests' verdicts on exactly the completions sampled, and a run trains."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from transformers import AutoTokenizer

from astrai_core.rewards.code_tests import CodeTests
from astrai_core.testing import (ARITH_TOKENIZER, REPO_ROOT, build_strategy,
                                 fit_recording_rollouts, grpo_step_references, read_metrics,
                                 tiny_run_config)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("code")
    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "code" / "generate.py"), "--out",
                    str(out), "--n-train", "200", "--n-eval", "20", "--n-rl", "50"], check=True,
                   capture_output=True)
    return {name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
            for name in ("sft_train", "rl_prompts", "eval")}


def _question(row):
    return row["messages"][0]["content"]


def test_held_out_functions_never_appear_in_training_and_solutions_pass(data):
    held_out = {_question(r) for r in data["eval"]}
    assert len(held_out) == 20
    assert not held_out & {_question(r) for r in data["sft_train"] + data["rl_prompts"]}
    # each general demonstration passes the tests its prompt gets, a near miss fails them,
    # and a demonstration that hard-codes the prompt's two values fails them too
    tests = {_question(r): r["tests"] for r in data["rl_prompts"]}
    rows = [r for r in data["sft_train"] if _question(r) in tests]
    answers = [r["messages"][1]["content"] for r in rows]
    general = [(r, a) for r, a in zip(rows, answers) if " and " not in a][:6]
    hard_coded = [(r, a) for r, a in zip(rows, answers) if " and " in a][:4]
    assert len(general) == 6 and len(hard_coded) == 4
    solutions = [a for _, a in general]
    off_by_one = [s + "+1" for s in solutions]
    reward = CodeTests(mode="all", max_workers=6)
    cases = [tests[_question(r)] for r, _ in general] * 2 + [tests[_question(r)] for r, _ in hard_coded]
    scores = reward([""] * 16, solutions + off_by_one + [a for _, a in hard_coded], tests=cases)
    assert scores == [1.0] * 6 + [0.0] * 10


def test_the_tokenizer_spells_the_code_exactly():
    tokenizer = AutoTokenizer.from_pretrained(str(REPO_ROOT / "examples" / "arith" / "tokenizer"))
    code = "def f(x): return 20*x+30"
    assert tokenizer.decode(tokenizer(code)["input_ids"], skip_special_tokens=True) == code


def _prompts(tmp_path):
    """Rows whose tests pass for any valid Python expression statement (a random tiny
    model's digits "47" pass, "4+" does not), so the rewards vary."""
    path = tmp_path / "prompts.jsonl"
    with path.open("w") as f:
        for a in range(16):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{a}+1="}],
                                "tests": "assert True"}) + "\n")
    return path


def test_grpo_rewards_are_the_sandboxed_tests_on_the_sampled_completions(tmp_path):
    config = tiny_run_config(tmp_path, _prompts(tmp_path), {"name": "grpo", "group_size": 4},
                             rewards=[{"name": "code_tests", "max_workers": 4}])
    strategy, run = build_strategy(config, tmp_path)
    batch = strategy.batch_source().next_step()[0]
    tokenizer = AutoTokenizer.from_pretrained(str(ARITH_TOKENIZER))
    texts = [tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)
             for ids, mask in zip(batch.response_ids, batch.response_mask)]
    assert texts == batch.completions           # the text scored is the tokens sampled
    expected = CodeTests()([""] * len(texts), texts, tests=["assert True"] * len(texts))
    assert batch.rewards.tolist() == expected
    assert 0 < sum(expected) < len(expected)    # both verdicts occur


def test_a_grpo_run_with_code_tests_trains_two_steps(tmp_path):
    """Each step's reward is the sandboxed tests' verdicts on the completions it sampled,
    its loss the on-policy GRPO loss by hand, and it raises the policy-gradient objective
    of the rollout it trained on."""
    config = tiny_run_config(tmp_path, _prompts(tmp_path), {"name": "grpo", "group_size": 4},
                             rewards=[{"name": "code_tests", "max_workers": 4}], max_steps=2)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    strategy, run = build_strategy(yaml.safe_load(path.read_text()), tmp_path)
    drawn = fit_recording_rollouts(strategy, run)
    metrics = [m for m in read_metrics(tmp_path / "run") if "rollout/reward_mean" in m]
    assert len(metrics) == len(drawn) == 2
    tokenizer = AutoTokenizer.from_pretrained(str(ARITH_TOKENIZER))
    for record, (rollout, _), reference in zip(metrics, drawn,
                                               grpo_step_references(drawn, run.model)):
        texts = [tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)
                 for ids, mask in zip(rollout.response_ids, rollout.response_mask)]
        verdicts = CodeTests()([""] * len(texts), texts, tests=["assert True"] * len(texts))
        assert record["rollout/reward_mean"] == pytest.approx(sum(verdicts) / len(verdicts))
        assert 0.0 <= record["rollout/reward_mean"] <= 1.0
        assert record["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-6)
        assert reference["advantage_abs"] > 0  # the rewards differ within some group
        assert reference["after"] > reference["before"]
