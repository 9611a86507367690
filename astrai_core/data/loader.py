"""Batches for the trainer and prompts for the rollout runner, with exact resume.

Four loaders, one per batch kind, all driven by an ``ExampleStream``:

- ``SequenceLoader`` (text, chat): dicts with ``input_ids``, ``position_ids``,
  ``attention_mask`` (long) and ``loss_mask`` (bool), each [B, S]. ``loss_mask[b, t]``
  True means token t is a target predicted from position t-1 (column 0 is never one).
- ``PreferenceLoader``: the same four tensors prefixed ``chosen_`` and ``rejected_``,
  one common width; the loss mask covers only response tokens; ``margin`` [B] when the
  data gives margins.
- ``UnpairedLoader``: the four tensors of one completion per row (the loss mask on its
  response tokens) and ``label`` (bool [B], True = desirable).
- ``PromptLoader``: lists of ``PromptRecord``.

Training loaders iterate forever (epoch after epoch) and ``state_dict()`` /
``load_state_dict()`` capture the exact position; evaluation loaders (``EvalLoader``)
read their one source in file order and end after one pass, each time they are iterated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from astrai_core.data.mixing import ExampleStream
from astrai_core.data.packing import (SequenceExamples, collate_rows, take_packed_row,
                                      take_rows)
from astrai_core.errors import DataError


@dataclass
class PromptRecord:
    """One RL prompt: its token ids, its text, and the row's other columns verbatim;
    ``images``: a vision-language model's image inputs of the prompt, the processor's
    output for it alone (None: a prompt without images)."""

    prompt_ids: list[int]
    prompt_text: str
    columns: dict[str, Any] = field(default_factory=dict)
    images: dict[str, np.ndarray] | None = None


class _StreamLoader:
    """Shared iteration and state handling; subclasses build ``_next_batch``."""

    kind = ""

    def __init__(self, stream: ExampleStream, batch_size: int):
        self.stream, self.batch_size = stream, batch_size

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = self._next_batch()
        if batch is None:
            raise StopIteration
        return batch

    def _next_batch(self) -> Any:
        raise NotImplementedError

    def _take_examples(self) -> list[tuple[int, int]]:
        """Up to ``batch_size`` (source, example) pairs; fewer when a finite stream ends."""
        return [pair for pair in (self.stream.take() for _ in range(self.batch_size))
                if pair is not None]

    @property
    def epoch(self) -> int:
        """Completed passes over the first source."""
        return self.stream.epochs[0]

    def state_dict(self) -> dict[str, Any]:
        """The data position (plain ints and lists) to store in a checkpoint."""
        return {"kind": self.kind, "stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise DataError(f"the checkpoint's data position is for {state.get('kind')!r} "
                            f"batches, this data makes {self.kind!r} batches")
        self.stream.load_state_dict(state["stream"])


class SequenceLoader(_StreamLoader):
    """Text/chat batches, packed into rows of ``seq_len`` or one example per row."""

    kind = "sequence"

    def __init__(self, examples: list[SequenceExamples], stream: ExampleStream, *,
                 batch_size: int, seq_len: int, pack: bool, pad_id: int = 0):
        super().__init__(stream, batch_size)
        self.examples, self.seq_len, self.pack, self.pad_id = examples, seq_len, pack, pad_id

    def _take_single(self) -> list[dict[str, np.ndarray]]:
        pair = self.stream.take()
        return [] if pair is None else [self.examples[pair[0]].get(pair[1])]

    def _next_batch(self) -> dict[str, torch.Tensor] | None:
        if self.pack:
            rows = take_rows(self.batch_size,
                             lambda: take_packed_row(self.stream, self.examples, self.seq_len))
        else:
            rows = take_rows(self.batch_size, self._take_single)
        if not rows:
            return None
        return collate_rows(rows, self.seq_len if self.pack else None, self.pad_id)


class PreferenceLoader(_StreamLoader):
    """Chosen/rejected pairs, one pair per row, both sides padded to one width.

    ``margins``: per source, each pair's ``margin`` (NaN: none given) or None; when any
    source has them, batches carry ``margin`` [B] float32 (0 for pairs without one).
    """

    kind = "preference"

    def __init__(self, pairs: list[tuple[SequenceExamples, SequenceExamples]],
                 stream: ExampleStream, *, batch_size: int, pad_id: int = 0,
                 margins: list[np.ndarray | None] | None = None):
        super().__init__(stream, batch_size)
        self.pairs, self.pad_id = pairs, pad_id
        self.margins = margins if margins and any(m is not None for m in margins) else None

    def _next_batch(self) -> dict[str, torch.Tensor] | None:
        taken = self._take_examples()
        if not taken:
            return None
        chosen = [[self.pairs[s][0].get(k)] for s, k in taken]
        rejected = [[self.pairs[s][1].get(k)] for s, k in taken]
        width = max(sum(len(d["input_ids"]) for d in row) for row in chosen + rejected)
        batch = {}
        for side, rows in (("chosen", chosen), ("rejected", rejected)):
            for name, tensor in collate_rows(rows, width, self.pad_id).items():
                batch[f"{side}_{name}"] = tensor
        if self.margins is not None:
            batch["margin"] = torch.tensor([self._margin(s, k) for s, k in taken],
                                           dtype=torch.float32)
        return batch

    def _margin(self, source: int, k: int) -> float:
        margins = self.margins[source]
        value = math.nan if margins is None else float(margins[self.pairs[source][0].doc[k]])
        return 0.0 if math.isnan(value) else value


def both_sides(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A preference batch as one sequence batch: its chosen rows, then its rejected rows
    (every tensor of a side, a vision-language model's image tensors included: both sides
    of a pair hold the prompt's images, per token as wide as the batch)."""
    names = [key.removeprefix("chosen_") for key in batch if key.startswith("chosen_")]
    return {name: torch.cat([batch[f"{side}_{name}"] for side in ("chosen", "rejected")])
            for name in names}


def unpaired_labels(source: Any) -> np.ndarray:
    """The labels of an unpaired source's rows (bool, True = desirable)."""
    return np.asarray([record["label"] for record in source.records], dtype=bool)


class UnpairedLoader(_StreamLoader):
    """Labelled completions, one per row, padded to the longest row of the batch."""

    kind = "unpaired"

    def __init__(self, sources: list[tuple[SequenceExamples, np.ndarray]],
                 stream: ExampleStream, *, batch_size: int, pad_id: int = 0):
        super().__init__(stream, batch_size)
        self.sources, self.pad_id = sources, pad_id

    def _next_batch(self) -> dict[str, torch.Tensor] | None:
        taken = self._take_examples()
        if not taken:
            return None
        batch = collate_rows([[self.sources[s][0].get(k)] for s, k in taken], None, self.pad_id)
        # SequenceExamples.doc maps an example back to its row, and so to its label
        batch["label"] = torch.tensor([bool(self.sources[s][1][self.sources[s][0].doc[k]])
                                       for s, k in taken])
        return batch


class PromptExamples:
    """The prompts of one source not longer than ``max_prompt_len`` tokens (None: all);
    ``skipped`` counts the others."""

    def __init__(self, source: Any, max_prompt_len: int | None, field_name: str = "data"):
        self.source = source
        ragged = source.fields["prompt"]
        lengths = ragged.lengths()
        self.keep = np.flatnonzero(lengths <= (max_prompt_len or np.inf))
        self.skipped = len(ragged) - len(self.keep)
        if not len(self.keep):
            raise DataError(f"{field_name}: every prompt in {source.path} is longer than "
                            f"data.max_prompt_len={max_prompt_len} tokens (the shortest has "
                            f"{int(lengths.min()) if len(lengths) else 0})")

    def __len__(self) -> int:
        return len(self.keep)

    def get(self, k: int) -> PromptRecord:
        row = int(self.keep[k])
        record = self.source.records[row]
        ids = self.source.fields["prompt"].tokens_of(row)
        images = self.source.images.of(row) if self.source.images is not None else None
        return PromptRecord(prompt_ids=[int(x) for x in ids], prompt_text=record["prompt_text"],
                            columns=dict(record["columns"]), images=images or None)

    @property
    def has_images(self) -> bool:
        """Whether any prompt of the source holds images."""
        return self.source.images is not None and bool(self.source.images.names)

    @property
    def every_prompt_has_images(self) -> bool:
        """Whether every prompt kept holds images."""
        names = self.source.images.names if self.source.images is not None else {}
        return all(int(row) in names for row in self.keep)


class PromptLoader(_StreamLoader):
    """Lists of ``batch_size`` prompt records, in a deterministic, resumable order."""

    kind = "prompt"

    def __init__(self, prompts: list[PromptExamples], stream: ExampleStream, *, batch_size: int):
        super().__init__(stream, batch_size)
        self.prompts = prompts
        self.skipped = sum(p.skipped for p in prompts)  # longer than data.max_prompt_len
        self.has_images = any(p.has_images for p in prompts)
        # some prompts hold images and others none (rollout/images.py refuses it in a run
        # of several processes)
        self.mixes_images = self.has_images and not all(p.every_prompt_has_images
                                                        for p in prompts)

    def _next_batch(self) -> list[PromptRecord] | None:
        records = [self.prompts[s].get(k) for s, k in self._take_examples()]
        return records or None


class EvalLoader:
    """One unshuffled pass over the eval source, anew each time it is iterated."""

    def __init__(self, make_loader: Any, kind: str):
        self._make_loader, self.kind = make_loader, kind

    def __iter__(self) -> Iterator[Any]:
        return iter(self._make_loader())
