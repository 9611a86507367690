"""The maths rewards on hand cases: equivalent forms score 1, wrong answers and garbage 0."""

from __future__ import annotations

import pytest

from astrai_core.config.plan import Resolver
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.rewards.maths import Gsm8k, MathVerify, gsm8k_answer

GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
                  "#### 72")


@pytest.mark.parametrize("text,extract,expected", [
    ("so the total is\n#### 72", "strict", "72"),
    ("#### 1,234", "strict", "1234"),
    ("#### $18.50", "strict", "18.50"),
    ("#### -3", "strict", "-3"),
    ("the answer is 72 apples", "strict", None),
    ("the answer is 72 apples", "flexible", "72"),
    ("first 3, then #### 5, later 9", "flexible", "5"),
    ("no number at all", "flexible", None),
])
def test_gsm8k_answer_extraction(text, extract, expected):
    got = gsm8k_answer(text, extract)
    assert (None if got is None else str(got)) == expected


def test_gsm8k_reward_compares_numbers_with_the_answer_column():
    reward = Gsm8k()
    completions = ["She sold 72 clips.\n#### 72", "#### 72.0", "#### 71",
                   "I think 72", "####", "garbage \x00 ###"]
    assert reward([""] * 6, completions, answer=[GSM8K_SOLUTION] * 6) == \
        [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert Gsm8k(extract="strict")([""], ["I think 72"], answer=["72"]) == [0.0]
    assert Gsm8k(answer_column="target")([""], ["#### 5"], target=["5"]) == [1.0]
    with pytest.raises(ValueError, match="'answer' column"):
        reward([""], ["#### 5"], solution=["5"])


math_verify = pytest.importorskip("math_verify")


@pytest.mark.parametrize("completion,answer,score", [
    (r"The answer is $\boxed{\frac{1}{2}}$", "0.5", 1.0),
    (r"so $\boxed{1/2}$", "0.5", 1.0),
    (r"$\boxed{0.5}$", r"\frac{1}{2}", 1.0),
    (r"We get $x = \boxed{3}$.", "3", 1.0),
    (r"$\boxed{\sqrt{4}}$", "2", 1.0),
    (r"$\boxed{2}$", "3", 0.0),
    (r"$\boxed{\frac{1}{3}}$", "0.5", 0.0),
    ("I have no idea", "0.5", 0.0),
    (r"$\boxed{\frac{1}{", "0.5", 0.0),
    ("", "0.5", 0.0),
])
def test_math_verify_equivalent_forms_wrong_answers_and_garbage(completion, answer, score):
    assert MathVerify()([""], [completion], answer=[answer]) == [score]


def test_math_verify_is_registered_and_a_missing_package_is_a_plan_error(monkeypatch):
    registry = load_plugins()
    assert {"gsm8k", "math_verify"} <= set(registry.names("reward_function"))
    resolve = Resolver(registry)
    assert resolve.reward("math_verify", 1.0, {}, ("rewards", 0)).label == "math_verify"
    monkeypatch.setattr(MathVerify, "requires", ("astrai_no_such_module",))
    with pytest.raises(ConfigError, match=r"rewards\.0\.name: reward 'math_verify' needs the "
                       r"'astrai_no_such_module' package, which is not installed: "
                       r"pip install 'astrai-core\[math\]'"):
        resolve.reward("math_verify", 1.0, {}, ("rewards", 0))
