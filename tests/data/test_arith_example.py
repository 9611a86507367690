"""The arithmetic example: its tokenizer and its deterministic, disjoint data."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ARITH_TOKENIZER, REPO

EXAMPLE = REPO / "examples" / "arith"


def test_each_character_is_one_token_and_text_round_trips(arith_tokenizer):
    assert 30 <= len(arith_tokenizer) <= 60
    for text in ("12+35=", "7*8=56", "3-99=-96", "what is 4 + 5?\nanswer: 9."):
        ids = arith_tokenizer(text)["input_ids"]
        assert len(ids) == len(text) and arith_tokenizer.unk_token_id not in ids
        assert arith_tokenizer.decode(ids) == text


def test_chat_template_and_special_tokens(arith_tokenizer):
    messages = [{"role": "user", "content": "12+35="}, {"role": "assistant", "content": "47"}]
    text = arith_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|user|>12+35=<|end|><|assistant|>47<|end|>"
    prompt = arith_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>12+35=<|end|><|assistant|>"
    ids = arith_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert arith_tokenizer.convert_ids_to_tokens(ids) == [
        "<|user|>", "1", "2", "+", "3", "5", "=", "<|end|>", "<|assistant|>", "4", "7", "<|end|>"]
    assert arith_tokenizer.eos_token == "<|end|>" and arith_tokenizer.pad_token == "<pad>"


def test_make_tokenizer_reproduces_the_committed_files(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLE / "make_tokenizer.py"), "--out", str(tmp_path)],
                   check=True)
    for path in ARITH_TOKENIZER.iterdir():
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def generate(out, seed=0):
    subprocess.run([sys.executable, str(EXAMPLE / "generate.py"), "--out", str(out), "--seed",
                    str(seed), "--n-train", "3000", "--n-eval", "200", "--n-rl", "500"], check=True)
    return {name: [json.loads(line) for line in (out / name).read_text().splitlines()]
            for name in ("sft_train.jsonl", "eval.jsonl", "rl_prompts.jsonl")}


def question(row):
    return row["messages"][0]["content"]


def answer(row):
    return row["messages"][1]["content"] if len(row["messages"]) > 1 else row["answer"]


def test_generate_is_deterministic_disjoint_and_correct(tmp_path):
    first, again, other = generate(tmp_path / "a"), generate(tmp_path / "b"), generate(tmp_path / "c", 1)
    assert first == again and first != other
    assert [len(first[n]) for n in ("sft_train.jsonl", "eval.jsonl", "rl_prompts.jsonl")] == [3000, 200, 500]
    held_out = {question(r) for r in first["eval.jsonl"]}
    assert len(held_out) == 200
    assert held_out.isdisjoint(question(r) for r in first["sft_train.jsonl"])
    assert held_out.isdisjoint(question(r) for r in first["rl_prompts.jsonl"])
    for rows in first.values():
        for row in rows:
            q = question(row)
            assert q.endswith("=") and str(eval(q[:-1])) == answer(row)  # noqa: S307 (digits only)
    ops = {next(c for c in question(r)[1:] if c in "+-*") for r in first["sft_train.jsonl"]}
    assert ops == {"+", "-", "*"}


def test_unpaired_rows_alternate_right_answers_and_near_misses(tmp_path):
    out = tmp_path / "a"
    before = generate(out)
    rows = [json.loads(line) for line in (out / "unpaired.jsonl").read_text().splitlines()]
    assert len(rows) == 5000 and [r["label"] for r in rows[:4]] == [True, False, True, False]
    held_out = {question(r) for r in before["eval.jsonl"]}
    for row in rows:
        q = question(row)
        assert q not in held_out and len(row["messages"]) == 1
        error = int(row["completion"]) - eval(q[:-1])  # noqa: S307 (digits only)
        assert error == 0 if row["label"] else error in (-10, -1, 1, 10)


def test_reward_model_pairs_are_right_against_wrong_and_held_out_apart(tmp_path):
    out = tmp_path / "a"
    evals = generate(out)["eval.jsonl"]
    pairs = {name: [json.loads(line) for line in (out / name).read_text().splitlines()]
             for name in ("rm_train.jsonl", "rm_eval.jsonl")}
    assert len(pairs["rm_train.jsonl"]) == 5000
    assert [question(r) for r in pairs["rm_eval.jsonl"]] == [question(r) for r in evals]
    held_out = {question(r) for r in evals}
    assert held_out.isdisjoint(question(r) for r in pairs["rm_train.jsonl"])
    for rows in pairs.values():
        for row in rows:
            truth = str(eval(question(row)[:-1]))  # noqa: S307 (digits only)
            assert row["chosen"] == truth and row["rejected"] != truth
            assert row["rejected"].lstrip("-").isdigit()
            assert not (len(row["rejected"].lstrip("-")) > 1 and row["rejected"].lstrip("-")[0] == "0")
