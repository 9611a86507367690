"""code_tests: the share of a row's tests the completion's code passes, in the sandbox;
and the python tool in the tools environment."""

from __future__ import annotations

import json
import time

import pytest

from astrai_core.environments.base import AssistantTurn, ToolCall
from astrai_core.environments.tools import Tools
from astrai_core.rewards import RewardError, RewardSet, build_reward
from astrai_core.rewards.code_tests import extract_code, output_matches, parse_tests

ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\n"
GOOD = "Here:\n```python\ndef add(a, b):\n    return a + b\n```"
HALF = "```python\ndef add(a, b):\n    return a * b if a == 2 else a + b - (a == -1)\n```"
IO_CASES = [{"input": "3\n", "output": "9\n"}, {"input": "4\n", "output": "16"},
            {"input": "0", "output": "0\n\n"}]


def test_code_extraction():
    assert extract_code("```\nx = 1\n```\n```python\ny = 2\n```\n```\nz\n```") == "y = 2\n"
    assert extract_code("print(1)") == "print(1)"
    assert extract_code("a\n```py\nprint(2)\n```\nb ```python\nprint(3)") == "print(3)"
    assert output_matches("1 \n2\n\n", "1\n2") and not output_matches("1\n3", "1\n2")


def test_assert_tests_split_into_cases_with_their_setup():
    cases = parse_tests("import math\nassert f(1) == 1\nX = 2\nassert f(X) == math.sqrt(4)\n")
    assert [c.test for c in cases] == ["import math\nX = 2\nassert f(1) == 1",
                                       "import math\nX = 2\nassert f(X) == math.sqrt(4)"]
    assert [c.expected for c in parse_tests(json.dumps(IO_CASES))] == ["9\n", "16", "0\n\n"]
    assert len(parse_tests({"inputs": ["1", "2"], "outputs": ["1", "4"]})) == 2
    with pytest.raises(ValueError, match="must be code or a list"):
        parse_tests(3)


def test_fraction_and_all_or_nothing_on_assert_tests():
    fraction = build_reward("code_tests", {"timeout": 2})
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    completions = [GOOD, HALF, wrong, "not code at all"]
    # HALF passes add(1,2)=3 and add(2,2)=4 but fails add(-1,1): 2 of 3
    assert fraction([""] * 4, completions, tests=[ADD_TESTS] * 4) == [1.0, 2 / 3, 0.0, 0.0]
    strict = build_reward("code_tests", {"mode": "all"})
    assert strict([""] * 2, [GOOD, HALF], tests=[ADD_TESTS] * 2) == [1.0, 0.0]
    assert strict([""] * 2, [GOOD, HALF], tests=[ADD_TESTS.splitlines()] * 2) == [1.0, 0.0]



def test_stdin_stdout_cases():
    reward = build_reward("code_tests", {})
    square = "```python\nn = int(input())\nprint(n * n)\n```"
    double = "```python\nn = int(input())\nprint(n + n)\n```"   # right for 0 only
    assert reward([""] * 2, [square, double], tests=[IO_CASES, json.dumps(IO_CASES)]) == [1.0, 1 / 3]
    strict = build_reward("code_tests", {"mode": "all"})
    assert strict([""] * 2, [square, double], tests=[IO_CASES] * 2) == [1.0, 0.0]


def test_an_early_exit_does_not_skip_the_asserts():
    reward = build_reward("code_tests", {})
    cheat = "```python\nimport os\nos._exit(0)\n```"
    assert reward([""], [cheat], tests=[ADD_TESTS]) == [0.0]


def test_hostile_solutions_score_zero_and_the_batch_runs_in_parallel():
    reward = build_reward("code_tests", {"timeout": 1, "cpu_seconds": 1, "max_workers": 8})
    hostile = ["```python\nwhile True: pass\n```",
               "```python\nx = bytearray(4 * 1024 ** 3)\n```",
               "```python\nimport os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n```",
               "```python\nwhile True: print('x' * 1000)\n```"]
    start = time.monotonic()
    scores = reward([""] * 5, hostile + [GOOD], tests=[ADD_TESTS] * 5)
    assert scores == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert time.monotonic() - start < 8   # 15 cases, most of them time out after 1 s


def test_a_missing_tests_column_names_it():
    rewards = RewardSet.from_config([{"name": "code_tests"}])
    with pytest.raises(RewardError, match="needs a `tests` column"):
        rewards.score([""], [GOOD], [{}])


def test_the_python_tool_answers_with_output_and_exit_status():
    env = Tools(tools=["python"])
    assert env.schemas[0]["function"]["name"] == "python"
    assert env.schemas[0]["function"]["parameters"]["required"] == ["code"]
    calls = (ToolCall("python", json.dumps({"code": "print(6 * 7)"}), "a"),
             ToolCall("python", json.dumps({"code": "import sys\nprint('bad', file=sys.stderr)\n"
                                                    "sys.exit(2)"}), "b"),
             ToolCall("python", json.dumps({"code": "print('y' * 100000)"}), "c"))
    step = env.step(None, AssistantTurn(text="", content="", tool_calls=calls))
    first, second, third = (m.content for m in step.messages)
    assert first == "exit status 0\nstdout:\n42\n"
    assert second.startswith("exit status 2") and "stderr:\nbad" in second
    assert len(third) <= 2000 and "more chars" in third
    assert not step.done


def test_a_multi_turn_episode_with_the_python_tool():
    """The model calls python, reads the tool message (in the context, not in the loss)
    and answers; a program that loops forever gets the time-limit message instead."""
    from transformers import AutoTokenizer

    from astrai_core.environments.episode_config import EpisodeConfig
    from astrai_core.rollout.episodes import EpisodeRunner
    from astrai_core.rollout.records import as_prompt_record
    from astrai_core.sampling import SamplingParams
    from tests.rollout import episode_kit as kit

    tokenizer = AutoTokenizer.from_pretrained(str(kit.CALC_TOKENIZER))
    script = {"6*7": [kit.call("python", '{"code": "print(6*7)"}'), "42<|end|>"],
              "loop": [kit.call("python", '{"code": "while 1: pass"}'), "0<|end|>"]}
    rewards = RewardSet.from_config([{"name": "exact_match"}])
    runner = EpisodeRunner(Tools(tools=["python"]), kit.ScriptedSampler(tokenizer, script),
                           tokenizer, rewards, EpisodeConfig(max_turns=3),
                           pad_token_id=tokenizer.pad_token_id)
    records = []
    for question in ("6*7", "loop"):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             tokenize=False, add_generation_prompt=True)
        records.append(as_prompt_record({"prompt_ids": tokenizer(text, add_special_tokens=False)["input_ids"],
                                         "prompt_text": text, "columns": {"answer": "42"}}))
    batch = runner.run(records, SamplingParams(max_new_tokens=60, stop_token_ids=(tokenizer.eos_token_id,)))
    tool_spans = []
    for row in range(2):
        context = batch.response_ids[row][batch.context_mask[row]].tolist()
        text = tokenizer.decode(context, skip_special_tokens=False)
        tool_spans.append([part.split("<|end|>")[0] for part in text.split("<|tool|>")[1:]])
        model_only = batch.response_ids[row][batch.response_mask[row]].tolist()
        assert "exit status" not in tokenizer.decode(model_only)   # the tool's text is not trained
    assert tool_spans[0] == ["exit status 0\nstdout:\n42\n"]
    assert tool_spans[1][0].startswith("killed: over the time limit")
    assert batch.rewards.tolist() == [1.0, 0.0]
