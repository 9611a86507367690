"""The judge reward: template and parser alone, then end to end against `astrai serve`."""

from __future__ import annotations

import socket

import pytest

from astrai_core.errors import ConfigError
from astrai_core.rewards import RewardError, RewardSet
from astrai_plugin_rm.judge import Judge, JudgeError

TEMPLATE = "Rate {prompt} -> {completion} (expected {answer})"
ROWS = [("3+4=", "7", "7", "Score: 9"), ("5+5=", "12", "10", "Score: 2"),
        ("8+1=", "9", "9", "no idea")]  # (prompt, completion, answer, the judge's reply)


def _judge(**options) -> Judge:
    return Judge(**{"base_url": "http://127.0.0.1:9/v1", "model": "m",
                    "prompt_template": TEMPLATE, **options})


def test_template_and_parser():
    judge = _judge(scale=[0, 10], default_score=-1.0)
    assert judge.render("3+4=", "7", {"answer": "7"}) == "Rate 3+4= -> 7 (expected 7)"
    assert judge.parse("Score: 9 out of 10") == pytest.approx(0.9)
    assert judge.parse("Score: 15") == 1.0 and judge.parse("-3") == 0.0  # clipped
    assert judge.parse("nothing") == -1.0
    assert _judge().parse("I'd say 7.5, maybe 8") == 7.5  # raw, the first match
    assert _judge(score_pattern=r"\[\[(\d)\]\]").parse("[[4]] (not 5)") == 4.0
    with pytest.raises(JudgeError, match=r"\{answer\}.*neither"):
        judge.render("p", "c", {})


@pytest.mark.parametrize("options, message", [
    ({"prompt_template": "no placeholder"}, "no {completion} placeholder"),
    ({"score_pattern": "(unclosed"}, "not a regular expression"),
    ({"scale": [10, 0]}, "low < high"),
])
def test_bad_options_fail_at_config_time(options, message):
    entry = {"name": "judge", "base_url": "http://x/v1", "model": "m",
             "prompt_template": TEMPLATE, **options}
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("(", r"\(")):
        RewardSet.from_config([entry])


def test_unreachable_endpoint_is_one_clear_line():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rewards = RewardSet.from_config([{
        "name": "judge", "base_url": f"http://127.0.0.1:{port}/v1", "model": "m",
        "prompt_template": TEMPLATE, "max_retries": 0, "timeout": 5}])
    with pytest.raises(RewardError) as caught:
        rewards.score(["1+1="], ["2"], [{"answer": "2"}])
    message = str(caught.value)
    assert "cannot reach http://127.0.0.1" in message and "\n" not in message


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    """`astrai serve` of a tiny model fitted to answer each ROWS message with its reply."""
    pytest.importorskip("fastapi")
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.testing import serving as testkit

    directory = testkit.build_checkpoint(tmp_path_factory.mktemp("judge") / "model", seed=2)
    tokenizer = load_tokenizer(directory)
    judge = _judge()
    examples = []
    for prompt, completion, answer, reply in ROWS:
        messages = [{"role": "user", "content": judge.render(prompt, completion,
                                                             {"answer": answer})}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        examples.append((tokenizer(text, add_special_tokens=False)["input_ids"],
                         tokenizer(reply, add_special_tokens=False)["input_ids"]
                         + [tokenizer.eos_token_id]))
    testkit.train_to_replay(directory, examples, steps=80)
    with testkit.live_server(directory, name="judge-model") as live:
        yield live


def test_judge_against_astrai_serve(judge_server):
    rewards = RewardSet.from_config([{
        "name": "judge", "base_url": judge_server.base_url, "model": "judge-model",
        "prompt_template": TEMPLATE, "scale": [0, 10], "default_score": -1.0,
        "max_concurrency": 2, "max_tokens": 8}])
    prompts, completions, answers, _ = zip(*ROWS)
    totals, _ = rewards.score(list(prompts), list(completions),
                              [{"answer": a} for a in answers])
    assert totals == pytest.approx([0.9, 0.2, -1.0])  # in row order, whatever finished first
    # a template that fills in something else is another request: not the fitted replies
    other = RewardSet.from_config([{
        "name": "judge", "base_url": judge_server.base_url, "model": "judge-model",
        "prompt_template": "Judge {completion} for {prompt}", "scale": [0, 10],
        "default_score": -1.0, "max_tokens": 8}])
    assert other.score(list(prompts), list(completions), [{} for _ in ROWS])[0] \
        != pytest.approx([0.9, 0.2, -1.0])
