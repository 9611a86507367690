"""String prompts after chat SFT: wrapped as a user turn by the chat template, they score
what the same prompts as messages score (raw, the model never saw them so and fails);
`astrai eval --show N` prints the prompts exactly as the model saw them."""

from __future__ import annotations

import json

import pytest
import structlog

from astrai_core.cli.main import main
from astrai_core.config.schema import RunConfig
from astrai_core.testing import read_metrics, tiny_run_config
from astrai_core.training.run import train

PAIRS = [(f"{a}+{b}=", str(a + b)) for a in range(6) for b in range(6)]
STEPS = 150


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def chat_sft(tmp_path_factory):
    """A tiny model trained on the sums as chats, with string-prompt and message-prompt
    evaluation sets of the same sums."""
    tmp = tmp_path_factory.mktemp("chat_sft")
    chats = _write(tmp / "sft.jsonl", [{"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}
                                       for q, a in PAIRS])
    strings = _write(tmp / "strings.jsonl", [{"prompt": q, "answer": a} for q, a in PAIRS])
    messages = _write(tmp / "messages.jsonl", [{"messages": [{"role": "user", "content": q}],
                                                "answer": a} for q, a in PAIRS])
    config = tiny_run_config(tmp, chats, {"name": "sft"}, data_format="chat", max_steps=STEPS,
                             lr=3e-3, rewards=[{"name": "exact_match"}], eval_every=STEPS)
    config["data"].update(batch_size=16, pack=False,
                          eval={"path": str(strings), "format": "prompt"},
                          eval_sets=[{"name": "messages", "path": str(messages),
                                      "format": "prompt"}])
    train(RunConfig.model_validate(config))
    return tmp, strings, messages


def _eval(capsys, *args):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-format", "json", "eval", *args])
    assert exit_info.value.code == 0
    out = capsys.readouterr()
    return json.loads(out.out[out.out.index("{\n"):]), out.err


def test_string_prompts_score_as_messages_after_chat_sft(chat_sft, capsys):
    tmp, strings, messages = chat_sft
    final = read_metrics(tmp / "run")[-1]
    assert final["eval/accuracy"] == final["eval/messages/accuracy"] >= 0.9  # the run's eval
    checkpoint = str(tmp / "run" / "checkpoints" / f"step_{STEPS}")
    common = ("--cache-dir", str(tmp / "cache"))
    as_messages, _ = _eval(capsys, checkpoint, "--data", str(messages), *common)
    as_strings, _ = _eval(capsys, checkpoint, "--data", str(strings), *common)
    assert as_strings["eval/accuracy"] == as_messages["eval/accuracy"] == final["eval/accuracy"]
    raw, _ = _eval(capsys, checkpoint, "--data", str(strings), "--no-chat-template", *common)
    assert raw["eval/accuracy"] < 0.5  # the trap when a run asks for raw text


def test_show_prints_the_prompts_as_the_model_saw_them(chat_sft, capsys):
    tmp, strings, _ = chat_sft
    checkpoint = str(tmp / "run" / "checkpoints" / f"step_{STEPS}")
    got, err = _eval(capsys, checkpoint, "--data", str(strings), "--show", "2",
                     "--cache-dir", str(tmp / "cache"))
    assert err.count("--- sample") == 2 and got["prompts"] == len(PAIRS)
    assert "prompt:     '<|user|>0+0=<|end|><|assistant|>'\ncompletion: '0'" in err
    _, err = _eval(capsys, checkpoint, "--data", str(strings), "--show", "1",
                   "--no-chat-template", "--cache-dir", str(tmp / "cache"))
    assert "prompt:     '0+0='\n" in err and err.count("--- sample") == 1
