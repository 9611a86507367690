"""The calc example's data, tokenizer and tool, and the tools environment's schemas."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from astrai_core.data.render import render_chat
from astrai_core.environments.calculator import calculator
from astrai_core.environments.tools import Tools
from astrai_core.serving.hermes import parse_hermes
from astrai_core.testing import REPO_ROOT
from tests.rollout.episode_kit import CALC_TOKENIZER

CALCULATOR = "astrai_core.environments.calculator:calculator"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("calc")
    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "calc" / "generate.py"), "--out",
                    str(out), "--n-train", "300", "--n-eval", "40", "--n-rl", "50"], check=True,
                   capture_output=True)
    return {name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
            for name in ("sft_train", "rl_prompts", "eval_tool", "eval_no_tool")}


def _question(row):
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


def test_held_out_problems_never_appear_in_training(data):
    held_out = {_question(r) for r in data["eval_tool"]}
    assert held_out == {_question(r) for r in data["eval_no_tool"]} and len(held_out) == 40
    assert not held_out & {_question(r) for r in data["sft_train"] + data["rl_prompts"]}
    for row in data["eval_tool"]:
        assert calculator(_question(row)[:-1]) == row["answer"]


def test_demonstrations_train_only_the_assistant_turns_and_parse_as_tool_calls(data):
    tokenizer = AutoTokenizer.from_pretrained(str(CALC_TOKENIZER))
    with_tool = next(r for r in data["sft_train"] if len(r["messages"]) == 5)
    ids, mask = render_chat(tokenizer, with_tool["messages"])
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    call, answer = with_tool["messages"][2]["content"], with_tool["messages"][4]["content"]
    assert trained == f"{call}<|end|>{answer}<|end|>"  # never the tool's result or the question
    parsed = parse_hermes(tokenizer.decode(tokenizer(call, add_special_tokens=False)["input_ids"]))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("calculator", {"expression": _question(with_tool)[:-1]})]
    assert len(tokenizer(call, add_special_tokens=False)["input_ids"]) == len(_question(with_tool)) + 3


def test_the_calculator_is_exact_and_refuses_anything_but_arithmetic():
    assert calculator("123*45") == "5535" and calculator("12+345+6+78") == "441"
    assert calculator("7/2") == "3.5" and calculator("-(3-5)*2") == "4" and calculator("1/3") == "0.333333"
    for bad in ("2**99", "__import__('os')", "x+1", "1/0", "1+"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculator(bad)


def test_tools_are_described_in_the_openai_format_by_their_signatures():
    tools = Tools(tools=[CALCULATOR, "tests.rollout.episode_kit:add"])
    assert tools.schemas[0] == {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % and parentheses, exactly.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}}
    assert tools.schemas[1]["function"]["parameters"] == {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a"]}
