"""Examples of bounded length, packing them into rows, and collating rows into tensors.

A document is a dict of per-token numpy arrays: always ``input_ids``, and
``loss_mask`` when its source decides which tokens are targets (chat, preference).
Fields a source lacks are filled by their meaning (``mixing.fill_value``).

Row layout, for each document placed at columns [t, t+n): ``position_ids`` run 0..n-1,
so a position that does not increase by one marks a document start: the model attends
within each document only (the native model computes attention per document). ``loss_mask`` is False at every document start
(nothing predicts it from inside the document) and on padding. Padding has
``attention_mask`` 0 and positions that continue the last document, so no query of
the row is left with nothing to attend to.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from astrai_core.data.image_batch import PREFIX, collate_images, has_images
from astrai_core.data.mixing import ExampleStream, fill_value
from astrai_core.data.tokenize import Ragged
from astrai_core.data.vision_render import FieldTensors, RowTensors

Document = dict[str, np.ndarray]


class SequenceExamples:
    """The examples of one ragged field with every example at most ``seq_len`` tokens.

    ``overflow="truncate"`` keeps the first ``seq_len`` tokens of a long sequence;
    ``"split"`` cuts it into consecutive pieces of ``seq_len`` (the last may be
    shorter), each trained as its own document.
    """

    def __init__(self, ragged: Ragged, seq_len: int, overflow: str = "truncate",
                 images: RowTensors | FieldTensors | None = None):
        self.ragged, self.images = ragged, images
        lengths = ragged.lengths()
        if overflow == "truncate":
            self.doc = np.arange(len(lengths))
            self.start = np.zeros(len(lengths), dtype=np.int64)
            self.length = np.minimum(lengths, seq_len)
        elif overflow == "split":
            pieces = np.maximum(1, -(-lengths // seq_len))  # ceil, at least one
            self.doc = np.repeat(np.arange(len(lengths)), pieces)
            first = np.cumsum(pieces) - pieces
            self.start = (np.arange(len(self.doc)) - np.repeat(first, pieces)) * seq_len
            self.length = np.minimum(lengths[self.doc] - self.start, seq_len)
        else:
            raise ValueError(f"unknown overflow policy {overflow!r}")
        keep = self.length > 0  # an empty sequence holds nothing to train on
        self.doc, self.start, self.length = self.doc[keep], self.start[keep], self.length[keep]

    def __len__(self) -> int:
        return len(self.doc)

    def get(self, k: int) -> Document:
        doc, start, length = int(self.doc[k]), int(self.start[k]), int(self.length[k])
        begin = int(self.ragged.offsets[doc]) + start
        out = {"input_ids": np.asarray(self.ragged.tokens[begin:begin + length])}
        if self.ragged.targets is not None:
            out["loss_mask"] = np.asarray(self.ragged.targets[begin:begin + length])
        if self.images is not None:  # whole rows only: build.py refuses cutting them
            out.update({PREFIX + name: value for name, value in self.images.of(doc).items()})
        return out


def take_packed_row(stream: ExampleStream, examples: list[SequenceExamples],
                    seq_len: int) -> list[Document]:
    """Documents for one packed row, in stream order.

    A document that does not fit in the space left starts the next row instead (it is
    only peeked, not consumed), so documents are never cut at a row boundary.
    """
    row: list[Document] = []
    used = 0
    while used < seq_len:
        pair = stream.peek()
        if pair is None:
            break
        source, k = pair
        length = int(examples[source].length[k])
        if row and used + length > seq_len:
            break
        row.append(examples[source].get(k))
        used += length
        stream.advance()
    return row


def collate_rows(rows: list[list[Document]], width: int | None = None,
                 pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Tensors ``input_ids``, ``position_ids``, ``attention_mask`` (long) and
    ``loss_mask`` (bool), each [rows, width]; width defaults to the longest row."""
    lengths = [sum(len(d["input_ids"]) for d in row) for row in rows]
    width = max(lengths) if width is None else width
    shape = (len(rows), width)
    input_ids = np.full(shape, pad_id, dtype=np.int64)
    position_ids = np.zeros(shape, dtype=np.int64)
    attention_mask = np.zeros(shape, dtype=np.int64)
    loss_mask = np.zeros(shape, dtype=bool)
    for b, row in enumerate(rows):
        t = 0
        for doc in row:
            n = len(doc["input_ids"])
            input_ids[b, t:t + n] = doc["input_ids"]
            position_ids[b, t:t + n] = np.arange(n)
            attention_mask[b, t:t + n] = 1
            targets = doc.get("loss_mask")
            targets = (np.full(n, fill_value("loss_mask"), dtype=bool) if targets is None
                       else targets.astype(bool))
            loss_mask[b, t:t + n] = targets
            loss_mask[b, t] = False  # a document's first token has no predecessor in it
            t += n
        if t < width:
            start = int(position_ids[b, t - 1]) + 1 if t else 0
            position_ids[b, t:] = np.arange(start, start + width - t)
    batch = {"input_ids": torch.from_numpy(input_ids),
             "position_ids": torch.from_numpy(position_ids),
             "attention_mask": torch.from_numpy(attention_mask),
             "loss_mask": torch.from_numpy(loss_mask)}
    if has_images(rows):  # a vision-language model's rows (data/image_batch.py)
        batch.update(collate_images(rows, width))
    return batch


def take_rows(count: int, take_row: Callable[[], list[Document]]) -> list[list[Document]]:
    """Up to ``count`` non-empty rows (fewer when a finite stream runs out)."""
    rows = []
    for _ in range(count):
        row = take_row()
        if not row:
            break
        rows.append(row)
    return rows
