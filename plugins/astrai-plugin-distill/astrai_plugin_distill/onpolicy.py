"""Mixing student samples into the data: GKD's on-policy fraction.

Each micro-batch of ``chat`` rows (one conversation per row, ``data.pack: false``) comes
from the training loader. Of the ``data.batch_size`` rows of one loader batch, the rows
``g`` with ``floor((g + 1) f) > floor(g f)`` (``f = on_policy_fraction``; g the row's
index in the global batch) are on-policy: spread evenly, ``floor(batch_size * f)`` of
them, none for f = 0 and all for f = 1, and the same rows whatever the number of
processes. An on-policy row keeps its prompt (every token before the last assistant
reply) and gets the student's own completion of it from the run's sampler, in place of
the dataset's reply; only the completion's tokens carry the loss. The other rows keep the
dataset's reply. Each sampled row has its own seed (the sampler section's ``seed``, the
draw count and g), so the samples do not depend on how rows are split over processes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from astrai_core.api import SamplingParams, pad_rows


def on_policy_rows(first: int, count: int, fraction: float) -> list[int]:
    """Indices (in this share of ``count`` rows, global row ``first`` first) that are on-policy."""
    return [i for i in range(count)
            if math.floor((first + i + 1) * fraction) > math.floor((first + i) * fraction)]


def reply_start(loss_mask: Tensor) -> int | None:
    """Where a row's last run of target tokens (its last assistant reply) begins; None
    for a row without targets."""
    marks = loss_mask.tolist()
    if not any(marks):
        return None
    start = len(marks) - 1 - marks[::-1].index(True)  # the last target
    while start > 0 and marks[start - 1]:
        start -= 1
    return start


class OnPolicyMix:
    """A batch source: the loader source's micro-batches with on-policy rows re-sampled."""

    def __init__(self, source: Any, sampler: Any, sampling: SamplingParams, fraction: float,
                 batch_rows: int, first_row: int = 0, pad_token_id: int = 0) -> None:
        """``batch_rows``: rows of a global loader batch; ``first_row``: this process's
        first row in it."""
        self.source, self.sampler = source, sampler
        self.sampling = sampling.model_copy(update={"n": 1})  # one reply per row
        self.fraction, self.first_row, self.pad_token_id = fraction, first_row, pad_token_id
        self.planned = len(on_policy_rows(0, batch_rows, fraction))  # per global batch
        self.draws = 0  # micro-batches drawn so far: seeds each one's samples
        self.stats: dict[str, float] = {}

    def next_step(self) -> list[dict[str, Tensor]]:
        batches = [self.mix(batch) for batch in self.source.next_step()]
        # the global count (rows without a reply to replace keep the dataset's)
        self.stats = {"distill/on_policy_rows": float(self.planned * len(batches))}
        return batches

    def mix(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``batch`` with its on-policy rows' replies sampled by the student; ``on_policy``
        [N] bool says which rows they are."""
        lengths = batch["attention_mask"].sum(-1).tolist()
        rows = [batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
        targets = [batch["loss_mask"][i, :n].tolist() for i, n in enumerate(lengths)]
        starts = {i: reply_start(batch["loss_mask"][i, :lengths[i]])
                  for i in on_policy_rows(self.first_row, len(rows), self.fraction)}
        chosen = [i for i, start in starts.items() if start is not None]
        prompts = [rows[i][:starts[i]] for i in chosen]
        # every process samples, even with no row of its own: a sharded policy is gathered
        completions = self.sampler.generate(prompts, [self._params(self.first_row + i)
                                                      for i in chosen])
        for completion in completions:
            i = chosen[completion.prompt_index]
            rows[i] = prompts[completion.prompt_index] + list(completion.token_ids)
            targets[i] = [False] * len(prompts[completion.prompt_index]) + \
                [True] * len(completion.token_ids)
        self.draws += 1
        return self._collate(rows, targets, chosen)

    def _params(self, row: int) -> SamplingParams:
        if self.sampling.seed is None:
            return self.sampling
        return self.sampling.model_copy(
            update={"seed": self.sampling.seed + 1_000_003 * self.draws + row})

    def _collate(self, rows: list[list[int]], targets: list[list[bool]],
                 chosen: list[int]) -> dict[str, Tensor]:
        input_ids, attention = pad_rows(rows, left=False, pad_value=self.pad_token_id,
                                        dtype=torch.long)
        loss_mask, _ = pad_rows(targets, left=False, pad_value=False, dtype=torch.bool)
        width = input_ids.shape[1]
        on_policy = torch.zeros(len(rows), dtype=torch.bool)
        on_policy[chosen] = True
        return {"input_ids": input_ids, "attention_mask": attention.long(),
                "position_ids": torch.arange(width).expand(len(rows), width).clone(),
                "loss_mask": loss_mask, "on_policy": on_policy}

    def state_dict(self) -> dict[str, Any]:
        return {**self.source.state_dict(), "draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)
        self.draws = int(state.get("draws", 0))
