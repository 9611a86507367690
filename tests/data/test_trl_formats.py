"""TRL's dataset formats, read as they are: Parquet files with TRL's own column names and
no transform, recognised by ``format: auto`` and trained by the strategy each fits.

References: ``trl.data_utils.extract_prompt`` (the implicit prompt of preference pairs)
and the tokenizer itself (which tokens are the completion's).
"""

from __future__ import annotations

import json
import math

import pytest
import structlog

from astrai_core.config.schema import RunConfig
from astrai_core.data import DataConfig, build_train_loader
from astrai_core.data.auto_format import candidates
from astrai_core.data.sources import ROW_VALIDATORS, RowError
from astrai_core.errors import AstraiError
from astrai_core.testing import read_metrics, tiny_run_config
from astrai_core.training.run import train


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


PAIRS = [(f"{a}+{b}=", str(a + b)) for a in range(4) for b in range(4)]


def rows_of(kind: str, conversational: bool) -> list[dict]:
    """Rows of one TRL format, in its standard (strings) or conversational shape."""
    def prompt(q):
        return [user(q)] if conversational else q

    def said(text):
        return [assistant(text)] if conversational else text

    def wrong(a):  # a near miss, differing from the answer from its first character
        return str(int(a) + 1)

    def whole(q, a):  # an implicit-prompt conversation, or the text a standard one continues
        return [user(q), assistant(a)] if conversational else f"{q} {a}"

    table = {
        "language_modeling": lambda q, a: ({"messages": [user(q), assistant(a)]} if conversational
                                           else {"text": q + a}),
        "prompt_only": lambda q, a: {"prompt": prompt(q), "answer": a},
        "prompt_completion": lambda q, a: {"prompt": prompt(q), "completion": said(a)},
        "preference": lambda q, a: {"prompt": prompt(q), "chosen": said(a),
                                    "rejected": said(wrong(a))},
        "implicit_preference": lambda q, a: {"chosen": whole(q, a), "rejected": whole(q, wrong(a))},
        "unpaired": lambda q, a: {"prompt": prompt(q), "completion": said(wrong(a) if int(a) % 2 else a),
                                  "label": int(a) % 2 == 0},
    }
    return [table[kind](q, a) for q, a in PAIRS]


def write_parquet(path, rows):
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


# TRL format -> (the astrai format auto must choose, the strategy that trains it)
TRAINED_BY = {
    "language_modeling": (None, {"name": "sft"}),
    "prompt_only": ("prompt", {"name": "grpo", "group_size": 2}),
    "prompt_completion": ("prompt_completion", {"name": "sft"}),
    "preference": ("preference", {"name": "dpo"}),
    "implicit_preference": ("preference", {"name": "dpo"}),
    "unpaired": ("unpaired", {"name": "kto"}),
}


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
@pytest.mark.parametrize("kind", sorted(TRAINED_BY))
def test_every_trl_format_trains_from_parquet_as_it_is(kind, conversational, tmp_path, capsys):
    path = write_parquet(tmp_path / f"{kind}.parquet", rows_of(kind, conversational))
    expected, strategy = TRAINED_BY[kind]
    expected = expected or ("chat" if conversational else "text")
    config = tiny_run_config(tmp_path, path, strategy, data_format="auto",
                             rewards=[{"name": "exact_match"}], max_steps=2)
    config["data"]["batch_size"] = 4
    train(RunConfig.model_validate(config))
    last = read_metrics(tmp_path / "run")[-1]
    assert last["step"] == 2 and math.isfinite(last["loss"])
    out = capsys.readouterr()
    assert f"data.sources.0: format auto -> {expected} " in out.out + out.err


def test_stepwise_supervision_is_refused_in_one_line(tmp_path, capsys):
    rows = [{"prompt": q, "completions": ["step one", "step two"], "labels": [True, False]}
            for q, _ in PAIRS]
    path = write_parquet(tmp_path / "stepwise.parquet", rows)
    config = tiny_run_config(tmp_path, path, {"name": "sft"}, data_format="auto")
    with pytest.raises(AstraiError, match="process reward model.*text, chat, prompt_completion"):
        train(RunConfig.model_validate(config))
    with pytest.raises(ValueError, match="process reward model"):
        DataConfig(sources=[{"path": str(path), "format": "stepwise"}])


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_implicit_prompt_is_trls(conversational):
    from trl.data_utils import extract_prompt

    for row in rows_of("implicit_preference", conversational):
        reference = extract_prompt(dict(row))
        got = ROW_VALIDATORS["preference"](dict(row))
        prompt = got["messages"] if conversational else got["prompt"]
        assert (prompt, got["chosen"], got["rejected"]) == (
            reference["prompt"], reference["chosen"], reference["rejected"])
    with pytest.raises(RowError, match="share nothing"):
        ROW_VALIDATORS["preference"]({"chosen": "a b", "rejected": "c d"})
    with pytest.raises(RowError, match="one is the start of the other"):
        ROW_VALIDATORS["preference"]({"chosen": [user("q"), assistant("a")], "rejected": [user("q")]})


def test_auto_candidates_follow_trls_columns():
    assert candidates({"text": "x"}) == ["text"]
    assert candidates({"messages": [user("q"), assistant("a")]}) == ["chat", "prompt"]
    assert candidates({"prompt": "q", "completion": "a"}) == ["prompt_completion", "prompt"]
    assert candidates({"chosen": "q a", "rejected": "q b"}) == ["preference"]
    # an undesirable completion is never learned as a prompt-completion pair
    assert candidates({"prompt": "q", "completion": "a", "label": True}) == ["unpaired", "prompt"]
    assert candidates({"prompt": "q", "completions": ["a"], "labels": [True]}) == ["stepwise"]


def _single_rows(tmp_path, rows, **data):
    path = write_parquet(tmp_path / "pc.parquet", rows)
    cfg = DataConfig(sources=[{"path": str(path), "format": "auto"}], batch_size=len(rows),
                     pack=False, shuffle=False, cache_dir=tmp_path / "cache", **data)
    return next(build_train_loader(cfg, _tokenizer(), formats=("chat", "prompt_completion")))


def _tokenizer():
    from astrai_core.data import load_tokenizer
    from astrai_core.testing import ARITH_TOKENIZER

    return load_tokenizer(ARITH_TOKENIZER)


def test_prompt_completion_trains_on_the_completion_only(tmp_path):
    tokenizer = _tokenizer()
    rows = [{"prompt": "12+3=", "completion": "15"}, {"prompt": "7*8=", "completion": "56"}]
    batch = _single_rows(tmp_path, rows)
    for i, row in enumerate(rows):
        ids, mask = batch["input_ids"][i], batch["loss_mask"][i].bool()
        learned = tokenizer.convert_ids_to_tokens(ids[mask].tolist())
        assert learned == [*tokenizer.tokenize(row["completion"]), tokenizer.eos_token]
    whole = _single_rows(tmp_path, rows, completion_only_loss=False)
    real = whole["attention_mask"].bool()
    # every real token is a target but each document's first (nothing predicts it)
    assert whole["loss_mask"].sum().item() == real.sum().item() - len(rows)


def test_conversational_prompt_completion_masks_the_assistant_turn(tmp_path):
    tokenizer = _tokenizer()
    rows = [{"prompt": [user("12+3=")], "completion": [assistant("15")]}]
    batch = _single_rows(tmp_path, rows)
    ids, mask = batch["input_ids"][0], batch["loss_mask"][0].bool()
    assert tokenizer.decode(ids[mask].tolist()) == "15<|end|>"
    rendered = tokenizer.apply_chat_template([user("12+3="), assistant("15")], tokenize=False)
    assert tokenizer.decode(ids[batch["attention_mask"][0].bool()].tolist()) == rendered


def test_auto_picks_the_prompt_format_for_a_rollout_strategy(tmp_path, capsys):
    path = write_parquet(tmp_path / "pc.parquet",
                         [{"prompt": q, "completion": a, "answer": a} for q, a in PAIRS])
    config = tiny_run_config(tmp_path, path, {"name": "grpo", "group_size": 2},
                             data_format="auto", max_steps=1)
    config["data"]["batch_size"] = 4
    train(RunConfig.model_validate(config))
    out = capsys.readouterr()
    assert "format auto -> prompt " in out.out + out.err
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
