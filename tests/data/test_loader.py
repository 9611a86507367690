"""Loaders: exact resume, endless epochs, eval passes, preference, unpaired and prompt
batches."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.data import DataConfig, build_eval_loader, build_train_loader
from astrai_core.errors import DataError

from .conftest import chat


@pytest.fixture
def sources(write_jsonl):
    return {
        "text": write_jsonl("text.jsonl", [{"text": f"{a}-{a % 7}={a - a % 7}" * (1 + a % 3)}
                                           for a in range(23)]),
        "chat": write_jsonl("chat.jsonl", [chat(f"{a}+{a % 5}=", str(a + a % 5)) for a in range(17)]),
        "preference": write_jsonl("pref.jsonl", [
            {"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)} for a in range(11)]),
        "unpaired": write_jsonl("unpaired.jsonl", [  # right (label true) when a is even
            {"prompt": f"{a}+2=", "completion": str(a + 2 + a % 2), "label": a % 2 == 0}
            for a in range(9)]),
        "prompt": write_jsonl("prompt.jsonl", [
            {"messages": [{"role": "user", "content": f"{a}*3="}], "answer": str(3 * a)}
            for a in range(13)]),
    }


def config(tmp_path, srcs, **extra):
    return DataConfig(sources=[{"path": str(p), "format": f, "weight": w} for p, f, w in srcs],
                      cache_dir=tmp_path / "cache", **extra)


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return a == b


CASES = {
    "packed_mix": lambda s: ([(s["text"], "text", 2.0), (s["chat"], "chat", 1.0)],
                             {"seq_len": 24, "batch_size": 3}),
    "unpacked": lambda s: ([(s["chat"], "chat", 1.0)], {"pack": False, "batch_size": 4}),
    "preference": lambda s: ([(s["preference"], "preference", 1.0)], {"batch_size": 4}),
    "unpaired": lambda s: ([(s["unpaired"], "unpaired", 1.0)], {"batch_size": 4}),
    "prompt": lambda s: ([(s["prompt"], "prompt", 1.0)], {"batch_size": 5}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resume_sees_exactly_the_uninterrupted_batches(sources, tmp_path, arith_tokenizer, case):
    srcs, extra = CASES[case](sources)
    cfg = config(tmp_path, srcs, seed=3, **extra)
    uninterrupted = build_train_loader(cfg, arith_tokenizer)
    expected = [next(uninterrupted) for _ in range(25)]  # several epochs of every source
    for k in (0, 1, 7, 18):
        first = build_train_loader(cfg, arith_tokenizer)
        for i in range(k):
            assert same(next(first), expected[i])
        state = json.loads(json.dumps(first.state_dict()))  # plain JSON data
        resumed = build_train_loader(cfg, arith_tokenizer)
        resumed.load_state_dict(state)
        for i in range(k, 25):
            assert same(next(resumed), expected[i]), (k, i)


def test_iteration_is_endless_and_each_epoch_a_new_permutation(sources, tmp_path, arith_tokenizer):
    cfg = config(tmp_path, [(sources["prompt"], "prompt", 1.0)], batch_size=1)
    loader = build_train_loader(cfg, arith_tokenizer)
    answers = [next(loader)[0].columns["answer"] for _ in range(13 * 3)]
    epochs = [answers[13 * e:13 * (e + 1)] for e in range(3)]
    assert all(sorted(e, key=int) == [str(3 * a) for a in range(13)] for e in epochs)
    assert epochs[0] != epochs[1] and loader.epoch == 3


def test_unshuffled_training_reads_file_order(sources, tmp_path, arith_tokenizer):
    cfg = config(tmp_path, [(sources["prompt"], "prompt", 1.0)], batch_size=13, shuffle=False)
    batch = next(build_train_loader(cfg, arith_tokenizer))
    assert [r.columns["answer"] for r in batch] == [str(3 * a) for a in range(13)]


def test_prompt_records(sources, tmp_path, arith_tokenizer):
    cfg = config(tmp_path, [(sources["prompt"], "prompt", 1.0)], batch_size=2, shuffle=False)
    record = next(build_train_loader(cfg, arith_tokenizer))[1]
    assert record.prompt_text == "<|user|>1*3=<|end|><|assistant|>"
    assert arith_tokenizer.decode(record.prompt_ids) == record.prompt_text
    assert record.columns == {"answer": "3"}


def test_overlong_prompts_are_skipped(write_jsonl, tmp_path, arith_tokenizer):
    path = write_jsonl("p.jsonl", [{"prompt": "1+1="}, {"prompt": "123456789+1="}, {"prompt": "2="}])
    cfg = config(tmp_path, [(path, "prompt", 1.0)], batch_size=3, shuffle=False, max_prompt_len=6,
                 chat_template=False)  # raw text: the lengths counted are the prompts' own
    assert [r.prompt_text for r in next(build_train_loader(cfg, arith_tokenizer))] == [
        "1+1=", "2=", "1+1="]
    cfg = config(tmp_path, [(path, "prompt", 1.0)], max_prompt_len=1)
    with pytest.raises(DataError, match="every prompt .* longer than data.max_prompt_len=1"):
        build_train_loader(cfg, arith_tokenizer)


def test_preference_batch(sources, tmp_path, arith_tokenizer):
    cfg = config(tmp_path, [(sources["preference"], "preference", 1.0)], batch_size=3, shuffle=False)
    batch = next(build_train_loader(cfg, arith_tokenizer))
    assert sorted(batch) == sorted(f"{side}_{name}" for side in ("chosen", "rejected") for name in
                                   ("input_ids", "position_ids", "attention_mask", "loss_mask"))
    assert batch["chosen_input_ids"].shape == batch["rejected_input_ids"].shape
    for row, a in enumerate(range(3)):
        for side, answer in (("chosen", a + 1), ("rejected", a + 2)):
            ids = batch[f"{side}_input_ids"][row]
            real = batch[f"{side}_attention_mask"][row].bool()
            assert arith_tokenizer.decode(ids[real]) == f"{a}+1={answer}<|end|>"
            assert arith_tokenizer.decode(ids[batch[f"{side}_loss_mask"][row]]) == f"{answer}<|end|>"


def test_unpaired_batches_keep_each_completion_with_its_label(sources, tmp_path,
                                                              arith_tokenizer):
    cfg = config(tmp_path, [(sources["unpaired"], "unpaired", 1.0)], batch_size=4, seed=5)
    loader = build_train_loader(cfg, arith_tokenizer)
    assert loader.kind == "unpaired"
    seen = []
    for _ in range(5):  # shuffled, over more than two epochs
        batch = next(loader)
        assert sorted(batch) == ["attention_mask", "input_ids", "label", "loss_mask",
                                 "position_ids"]
        assert batch["label"].dtype == torch.bool and batch["label"].shape == (4,)
        for row in range(4):
            real = batch["attention_mask"][row].bool()
            text = arith_tokenizer.decode(batch["input_ids"][row][real])
            a = int(text.split("+")[0])
            completion = str(a + 2 + a % 2)
            assert text == f"{a}+2={completion}<|end|>"
            target = arith_tokenizer.decode(batch["input_ids"][row][batch["loss_mask"][row]])
            assert target == f"{completion}<|end|>"
            assert batch["label"][row].item() == (a % 2 == 0)
            seen.append(a)
    assert sorted(set(seen)) == list(range(9))


def test_unpaired_chat_rows_target_the_assistant_completion(write_jsonl, tmp_path,
                                                            arith_tokenizer):
    path = write_jsonl("chat_unpaired.jsonl", [
        {"messages": [{"role": "user", "content": "3*3="}],
         "completion": {"role": "assistant", "content": "9"}, "label": True},
        {"prompt": "3*4=", "completion": [{"role": "assistant", "content": "13"}],
         "label": False}])
    cfg = config(tmp_path, [(path, "unpaired", 1.0)], batch_size=2, shuffle=False)
    batch = next(build_train_loader(cfg, arith_tokenizer))
    assert batch["label"].tolist() == [True, False]
    for row, answer in enumerate(("9", "13")):
        target = arith_tokenizer.decode(batch["input_ids"][row][batch["loss_mask"][row]])
        assert target == f"{answer}<|end|>"
        assert "<|assistant|>" in arith_tokenizer.decode(batch["input_ids"][row])


def test_preference_margins_follow_their_pairs(write_jsonl, sources, tmp_path, arith_tokenizer):
    """A `margin` column reaches batches as `margin` [B], 0 for pairs (or sources) without."""
    rows = [{"prompt": f"{a}+2=", "chosen": str(a + 2), "rejected": str(a + 3)} for a in range(6)]
    for a, row in enumerate(rows):
        if a != 2:
            row["margin"] = a / 4
    with_margins = write_jsonl("margins.jsonl", rows)
    cfg = config(tmp_path, [(with_margins, "preference", 1.0)], batch_size=6, shuffle=False)
    batch = next(build_train_loader(cfg, arith_tokenizer))
    assert batch["margin"].tolist() == [0.0, 0.25, 0.0, 0.75, 1.0, 1.25]
    assert batch["margin"].dtype == torch.float32
    # mixed with a source without margins ("a+1=" rows), shuffled: margins stay with pairs
    cfg = config(tmp_path, [(with_margins, "preference", 1.0), (sources["preference"],
                                                                 "preference", 1.0)],
                 batch_size=16)
    batch = next(build_train_loader(cfg, arith_tokenizer))
    seen = set()
    for row in range(16):
        real = batch["chosen_attention_mask"][row].bool()
        prompt = arith_tokenizer.decode(batch["chosen_input_ids"][row][real]).split("=")[0]
        a, plus = (int(x) for x in prompt.split("+"))
        expected = (0.0 if a == 2 else a / 4) if plus == 2 else 0.0
        assert batch["margin"][row].item() == expected, prompt
        seen.add(plus)
    assert seen == {1, 2}
    bad = write_jsonl("bad.jsonl", [{**rows[0], "margin": "wide"}])
    with pytest.raises(DataError, match="line 1.*margin"):
        build_train_loader(config(tmp_path, [(bad, "preference", 1.0)]), arith_tokenizer)


def test_eval_loader_is_one_ordered_pass_each_time(sources, tmp_path, arith_tokenizer):
    cfg = config(tmp_path, [(sources["chat"], "chat", 1.0)], batch_size=4,
                 eval={"path": str(sources["prompt"]), "format": "prompt"})
    evaluation = build_eval_loader(cfg, arith_tokenizer)
    passes = [[r.columns["answer"] for batch in evaluation for r in batch] for _ in range(2)]
    assert passes[0] == passes[1] == [str(3 * a) for a in range(13)]
    assert evaluation.kind == "prompt"
    cfg = config(tmp_path, [(sources["chat"], "chat", 1.0)], seq_len=32, batch_size=2,
                 eval={"path": str(sources["chat"]), "format": "chat"})
    batches = list(build_eval_loader(cfg, arith_tokenizer))
    assert sum(int((b["position_ids"] == 0).logical_and(b["attention_mask"] == 1).sum())
               for b in batches) == 17  # every eval conversation exactly once
    assert build_eval_loader(config(tmp_path, [(sources["chat"], "chat", 1.0)]), arith_tokenizer) is None


def test_state_of_other_data_is_refused(sources, tmp_path, arith_tokenizer):
    loader = build_train_loader(config(tmp_path, [(sources["chat"], "chat", 1.0)]), arith_tokenizer)
    other = build_train_loader(config(tmp_path, [(sources["text"], "text", 1.0)]), arith_tokenizer)
    with pytest.raises(DataError, match="does not match these data sources"):
        other.load_state_dict(loader.state_dict())
    prompts = build_train_loader(config(tmp_path, [(sources["prompt"], "prompt", 1.0)]), arith_tokenizer)
    with pytest.raises(DataError, match="for 'sequence' batches"):
        prompts.load_state_dict(loader.state_dict())


def test_config_paths_resolve_against_the_config_directory(sources, tmp_path, arith_tokenizer):
    cfg = DataConfig.model_validate({"sources": [{"path": "chat.jsonl", "format": "chat"}],
                                     "cache_dir": "cache", "eval": {"path": "prompt.jsonl",
                                                                    "format": "prompt"}})
    resolved = cfg.resolve_paths(tmp_path)
    assert resolved.sources[0].path == sources["chat"]
    assert resolved.eval.path == sources["prompt"] and resolved.cache_dir == tmp_path / "cache"
    # the relative config reads the very same data as one spelling the absolute paths
    relative = next(build_train_loader(cfg, arith_tokenizer, base_dir=tmp_path))
    absolute = next(build_train_loader(config(tmp_path, [(sources["chat"], "chat", 1.0)]),
                                       arith_tokenizer))
    assert same(relative, absolute) and relative["loss_mask"].any()


def test_config_errors(sources, tmp_path, arith_tokenizer):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="extra_forbidden"):
        DataConfig.model_validate({"sources": [{"path": "a", "format": "text"}], "sq_len": 3})
    with pytest.raises(ValidationError, match="text and chat mix"):
        DataConfig.model_validate({"sources": [{"path": "a", "format": "text"},
                                               {"path": "b", "format": "prompt"}]})
    cfg = config(tmp_path, [(sources["text"], "text", 1.0)])
    with pytest.raises(DataError, match=r"data.sources\[0\].format: format 'text' is not accepted"):
        build_train_loader(cfg, arith_tokenizer, formats=("chat",))
