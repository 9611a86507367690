"""Built-in rewards on hand cases, user rewards by "module:function", and RewardSet errors."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from astrai_core.errors import ConfigError
from astrai_core.rewards import RewardError, RewardSet, RewardTerm, build_reward, exact_match, final_number


@pytest.mark.parametrize("text, number", [
    ("The answer is 42.", "42"),
    ("12+35=47", "47"),
    ("12-5=7", "7"),
    ("so x = -3", "-3"),
    ("-15", "-15"),
    ("total: 1,234,567 apples", "1234567"),
    ("pi is about 3.14159", "3.14159"),
    ("that is .5 of it", "0.5"),
    ("a list 1,2,3", "3"),
    ("(2)-1", "1"),               # a subtraction, not a negative number
    ("costs $1,000.50 now", "1000.50"),
    ("no digits here", None),
])
def test_final_number_extraction(text, number):
    assert final_number(text) == (Decimal(number) if number is not None else None)


def test_exact_match_compares_numerically_with_the_answer_column():
    completions = ["47", "the answer is 47.0", "1,000", "-3", "48", "", "3.5"]
    answers = ["47", 47, "1000", "-3", "47", "0", "3.50"]
    assert exact_match([""] * 7, completions, answer=answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_exact_match_without_answer_column_names_it():
    rewards = RewardSet.from_config([{"name": "exact_match"}])
    with pytest.raises(RewardError, match=r"reward 'exact_match' raised ValueError: needs an `answer` column"):
        rewards.score(["p"], ["1"], [{}])


def test_format_regex_search_and_fullmatch():
    search = build_reward("format_regex", {"pattern": r"\d+"})
    full = build_reward("format_regex", {"pattern": r"\d+", "mode": "fullmatch"})
    completions = ["42", "x 42 y", "none"]
    assert search([""] * 3, completions) == [1.0, 1.0, 0.0]
    assert full([""] * 3, completions) == [1.0, 0.0, 0.0]


def test_length_penalty_in_tokens_and_chars():
    tokens = build_reward("length_penalty", {"target": 2, "coef": 0.5})
    assert tokens(["", ""], ["abc", "a"], completion_ids=[[1, 2, 3, 4], [1]]) == [-1.0, 0.0]
    chars = build_reward("length_penalty", {"target": 1, "coef": 0.25, "unit": "chars"})
    assert chars(["", ""], ["abcde", "a"]) == [-1.0, 0.0]


def test_overlong_penalty_at_its_boundaries():
    # L_max 10, ramp L 4: no penalty up to 6 tokens, (6 - n) / 4 from 7 to 10, -1 beyond
    overlong = build_reward("overlong_penalty", {"max_length": 10, "cache": 4})
    lengths = [0, 6, 7, 8, 10, 11, 30]
    values = overlong([""] * len(lengths), [""] * len(lengths),
                      completion_ids=[[1] * n for n in lengths])
    assert values == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    with pytest.raises(ConfigError, match="cache .5. must not exceed max_length .4."):
        build_reward("overlong_penalty", {"max_length": 4, "cache": 5})
    with pytest.raises(ValueError, match="needs completion_ids"):
        overlong(["p"], ["c"])


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="format_regex"):
        build_reward("format_regex", {"pattern": "("})
    with pytest.raises(ConfigError, match="length_penalty"):
        build_reward("length_penalty", {"target": 1, "bogus": 2})
    with pytest.raises(ConfigError, match="takes no options"):
        build_reward("exact_match", {"strict": True})


def test_user_function_by_module_path_and_weighted_sum(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def shortness(prompts, completions, **columns):\n"
        "    return [1.0 / (1 + len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = RewardSet.from_config([{"name": "exact_match", "weight": 2.0},
                                     {"name": "my_rewards:shortness", "weight": -0.5}])
    assert rewards.names == ["exact_match", "shortness"]
    totals, components = rewards.score(["q1", "q2"], ["7", "abc"], [{"answer": "7"}, {"answer": "1"}])
    assert components == {"exact_match": [1.0, 0.0], "shortness": [0.5, 0.25]}
    assert totals == pytest.approx([2.0 - 0.25, -0.125])


def test_unknown_module_is_a_config_error():
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        RewardSet.from_config([{"name": "no_such_module_xyz:fn"}])


def test_columns_reach_rewards_as_lists():
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns)
        return [0.0] * len(completions)

    RewardSet([RewardTerm("spy", spy)]).score(["a", "b"], ["x", "y"], [{"answer": 1, "level": "easy"},
                                                                        {"answer": 2}],
                                             completion_ids=[[5], [6, 7]])
    assert seen == {"answer": [1, 2], "level": ["easy", None], "completion_ids": [[5], [6, 7]]}


@pytest.mark.parametrize("returned, reason", [
    ([1.0], "returned 1 values for 2 completions"),
    ([1.0, math.nan], r"returned a non-finite value \(nan\) for completion 1"),
    ([1.0, "x"], "returned 'x' for completion 1"),
    (3.0, "returned float"),
])
def test_bad_return_values_name_the_reward(returned, reason):
    rewards = RewardSet([RewardTerm("fine", lambda p, c, **k: [0.0] * len(c)),
                         RewardTerm("broken", lambda p, c, **k: returned)])
    with pytest.raises(RewardError, match=f"reward 'broken' {reason}"):
        rewards.score(["a", "b"], ["x", "y"], [{}, {}])


def test_raising_reward_names_itself_and_where():
    def explode(prompts, completions, **columns):
        raise KeyError("gold")

    with pytest.raises(RewardError, match=r"reward 'explode' raised KeyError: 'gold' \(at .*test_rewards.py:\d+\)"):
        RewardSet([RewardTerm("explode", explode)]).score(["a"], ["x"], [{}])


def test_repeated_reward_names_stay_apart():
    rewards = RewardSet.from_config([{"name": "format_regex", "pattern": "a"},
                                     {"name": "format_regex", "pattern": "b", "weight": 2.0}])
    totals, components = rewards.score(["", ""], ["a", "ab"], [{}, {}])
    assert components == {"format_regex": [1.0, 1.0], "format_regex_2": [0.0, 1.0]}
    assert totals == [1.0, 3.0]
