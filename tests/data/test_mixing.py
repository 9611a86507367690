"""Mixing weighted sources: deterministic, in proportion, fields filled by meaning."""

from __future__ import annotations

import numpy as np

from astrai_core.data import DataConfig, build_train_loader
from astrai_core.data.mixing import ExampleStream, fill_columns

from .conftest import chat


def split_documents(batch, row):
    ids = batch["input_ids"][row].tolist()
    starts = [t for t, p in enumerate(batch["position_ids"][row].tolist()) if p == 0]
    real = int(batch["attention_mask"][row].sum())
    bounds = starts + [real]
    return [(bounds[i], bounds[i + 1]) for i in range(len(starts))], ids


def test_text_and_chat_mix_with_masks_filled_by_meaning(write_jsonl, tmp_path, arith_tokenizer):
    text = write_jsonl("text.jsonl", [{"text": f"{a}+{a}={2 * a}"} for a in range(20)])
    chats = write_jsonl("chat.jsonl", [chat(f"{a}*2=", str(2 * a)) for a in range(20)])
    cfg = DataConfig(sources=[{"path": str(text), "format": "text"},
                              {"path": str(chats), "format": "chat"}],
                     seq_len=48, batch_size=4, cache_dir=tmp_path / "cache")
    batch = next(build_train_loader(cfg, arith_tokenizer))
    kinds = set()
    for row in range(4):
        spans, ids = split_documents(batch, row)
        for start, end in spans:
            doc = arith_tokenizer.decode(ids[start:end])
            loss = batch["loss_mask"][row, start:end].tolist()
            masked = arith_tokenizer.decode([t for t, m in zip(ids[start:end], loss) if m])
            if doc.startswith("<|user|>"):  # chat: only the answer and its end token
                kinds.add("chat")
                assert masked == doc.split("<|assistant|>")[1]
            else:  # text: the source has no mask, so every token but the first is a target
                kinds.add("text")
                assert loss == [False] + [True] * (end - start - 1)
    assert kinds == {"text", "chat"}


def test_draws_follow_the_weights_and_the_seed():
    stream = ExampleStream([50, 50], [3.0, 1.0], seed=1, shuffle=True)
    sources = [stream.take()[0] for _ in range(8000)]
    assert abs(np.mean(np.asarray(sources) == 0) - 0.75) < 0.02
    a = ExampleStream([50, 50], [3.0, 1.0], seed=1, shuffle=True)
    b = ExampleStream([50, 50], [3.0, 1.0], seed=1, shuffle=True)
    c = ExampleStream([50, 50], [3.0, 1.0], seed=2, shuffle=True)
    first = [a.take() for _ in range(300)]
    assert first == [b.take() for _ in range(300)]
    assert first != [c.take() for _ in range(300)]


def test_each_source_is_a_permutation_per_epoch():
    stream = ExampleStream([7, 5], [1.0, 1.0], seed=0, shuffle=True)
    seen: dict[int, list[int]] = {0: [], 1: []}
    while stream.epochs[1] < 3:
        source, index = stream.take()
        seen[source].append(index)
    for epoch in range(3):
        chunk = seen[1][5 * epoch:5 * (epoch + 1)]
        assert sorted(chunk) == list(range(5))
    assert seen[1][:5] != seen[1][5:10]  # reshuffled each epoch


def test_prompt_columns_missing_in_one_source_are_none():
    columns = fill_columns([{"answer": "4"}, {"answer": "9", "level": 2}, {"level": 1}])
    assert columns == {"answer": ["4", "9", None], "level": [None, 2, 1]}
