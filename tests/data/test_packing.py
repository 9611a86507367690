"""Packing: rows are the documents end to end, positions restart, no target at a start."""

from __future__ import annotations

import numpy as np
import pytest

from astrai_core.data.loader import SequenceLoader
from astrai_core.data.mixing import ExampleStream
from astrai_core.data.packing import SequenceExamples, collate_rows
from astrai_core.data.tokenize import Ragged


def ragged(docs: list[list[int]], targets: list[list[int]] | None = None) -> Ragged:
    offsets = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
    flat = np.concatenate([np.asarray(d, dtype=np.int32) for d in docs])
    mask = None if targets is None else np.concatenate([np.asarray(t, np.uint8) for t in targets])
    return Ragged(tokens=flat, offsets=offsets, targets=mask)


# Documents with distinct token values (100*doc + i), so each token tells where it came from.
DOCS = [[100 * d + i for i in range(n)] for d, n in enumerate([3, 5, 2, 7, 4, 1, 6, 3, 2, 5], 1)]


def loader(docs, *, seq_len=8, pack=True, batch_size=2, overflow="truncate", targets=None):
    examples = SequenceExamples(ragged(docs, targets), seq_len, overflow)
    stream = ExampleStream([len(examples)], [1.0], seed=0, shuffle=False, finite=True)
    return SequenceLoader([examples], stream, batch_size=batch_size, seq_len=seq_len, pack=pack,
                          pad_id=-1)


def documents_in(row_ids, row_positions, row_attention):
    """Split a row back into documents using only position_ids and attention_mask."""
    docs, current = [], []
    for token, position, real in zip(row_ids, row_positions, row_attention):
        if not real:
            break
        if position == 0 and current:
            docs.append(current)
            current = []
        current.append(token)
    return docs + ([current] if current else [])


def test_packed_rows_hold_the_documents_in_order():
    batches = list(loader(DOCS))
    rows = [(b["input_ids"][r].tolist(), b["position_ids"][r].tolist(),
             b["attention_mask"][r].tolist()) for b in batches for r in range(len(b["input_ids"]))]
    assert all(len(ids) == 8 for ids, _, _ in rows)
    recovered = [doc for row in rows for doc in documents_in(*row)]
    assert recovered == DOCS  # every document once, whole, in stream order
    # Greedy: a document that does not fit starts the next row.
    # lengths 3 5 | 2 | 7 | 4 1 | 6 | 3 2 | 5
    assert [len(documents_in(*row)) for row in rows] == [2, 1, 1, 2, 1, 2, 1]


def test_positions_restart_and_document_starts_are_never_targets():
    batch = next(iter(loader(DOCS, batch_size=5)))
    for b in range(5):
        ids, positions = batch["input_ids"][b], batch["position_ids"][b]
        real, loss = batch["attention_mask"][b].bool(), batch["loss_mask"][b]
        starts = positions == 0
        for t in range(8):
            if real[t] and not starts[t]:
                assert positions[t] == positions[t - 1] + 1 and ids[t] == ids[t - 1] + 1
        # text documents: every token except a document's first is a target; padding never.
        assert loss.tolist() == (real & ~starts).tolist()
        assert not loss[0]


def test_padding_continues_the_last_document_and_is_masked():
    batch = next(iter(loader([[1, 2, 3], [4, 5, 6, 7, 8, 9]], batch_size=2)))
    assert batch["input_ids"][0].tolist() == [1, 2, 3, -1, -1, -1, -1, -1]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert batch["loss_mask"][0].tolist() == [False, True, True] + [False] * 5


def test_targets_of_chat_documents_are_kept():
    docs = [[1, 2, 3, 4], [5, 6, 7]]
    targets = [[0, 0, 1, 1], [1, 0, 1]]  # a target flag on a first token is still dropped
    batch = next(iter(loader(docs, targets=targets)))
    assert batch["input_ids"][0].tolist()[:7] == [1, 2, 3, 4, 5, 6, 7]
    assert batch["loss_mask"][0].tolist() == [False, False, True, True, False, False, True, False]


def test_long_documents_are_truncated_or_split():
    long_doc = list(range(1, 20))  # 19 tokens, seq_len 8
    truncated = list(loader([long_doc], batch_size=4))
    assert len(truncated) == 1 and truncated[0]["input_ids"].tolist() == [long_doc[:8]]
    split = next(iter(loader([long_doc], batch_size=4, overflow="split")))
    assert split["input_ids"].tolist() == [long_doc[:8], long_doc[8:16], long_doc[16:] + [-1] * 5]
    assert split["position_ids"][1].tolist() == list(range(8))
    assert not split["loss_mask"][:, 0].any()


def test_unpacked_rows_are_right_padded_to_the_longest():
    batch = next(iter(loader(DOCS[:3], pack=False, batch_size=3, seq_len=16)))
    assert batch["input_ids"].shape == (3, 5)
    assert batch["input_ids"][0].tolist() == DOCS[0] + [-1, -1]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1, 1, 0, 0, 0]]
    assert batch["position_ids"][2].tolist() == [0, 1, 2, 3, 4]
    assert batch["loss_mask"][2].tolist() == [False, True, False, False, False]


def test_collated_dtypes():
    batch = collate_rows([[{"input_ids": np.array([5, 6], dtype=np.int32)}]], width=4)
    assert {k: str(v.dtype) for k, v in batch.items()} == {
        "input_ids": "torch.int64", "position_ids": "torch.int64",
        "attention_mask": "torch.int64", "loss_mask": "torch.bool"}


@pytest.mark.parametrize("pack", [True, False])
def test_every_token_survives_a_full_pass(pack):
    seen = []
    for batch in loader(DOCS, pack=pack, seq_len=8, batch_size=3):
        for r in range(len(batch["input_ids"])):
            seen.extend(documents_in(batch["input_ids"][r].tolist(), batch["position_ids"][r].tolist(),
                                     batch["attention_mask"][r].tolist()))
    assert seen == DOCS
