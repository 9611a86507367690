"""Deterministic streams of examples drawn from one or several weighted sources.

Everything random here is a pure function of the seed and a counter, so the whole
position of a stream is a few integers (see ``ExampleStream.state_dict``):

- the order of source ``s`` in epoch ``e`` is a permutation seeded by (seed, s, e);
- the source of the ``k``-th draw comes from blocks of choices seeded by (seed, block).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from astrai_core.errors import DataError

_CHOICE_BLOCK = 4096
_MIX_STREAM = 0x6D6978  # separates the mixing seeds from the permutation seeds


class ExampleStream:
    """An endless (or, with ``finite``, one-epoch) stream of ``(source, example)`` pairs.

    Each source is read in its own order, epoch after epoch; which source the next
    example comes from is drawn in proportion to ``weights``. ``peek`` looks at the next
    pair without consuming it, so a packer can decide before taking a document.
    """

    def __init__(self, sizes: list[int], weights: list[float], *, seed: int, shuffle: bool,
                 finite: bool = False):
        if len(sizes) != len(weights) or not sizes:
            raise ValueError("one weight per source, at least one source")
        if finite and len(sizes) != 1:
            raise ValueError("a finite stream reads a single source")
        for i, size in enumerate(sizes):
            if size == 0:
                raise DataError(f"data source {i} has no usable examples")
        self.sizes, self.seed, self.shuffle, self.finite = list(sizes), seed, shuffle, finite
        total = float(sum(weights))
        self.probabilities = np.asarray(weights, dtype=np.float64) / total
        self.draws = 0
        self.epochs = [0] * len(sizes)
        self.indices = [0] * len(sizes)
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        self._choices: tuple[int, np.ndarray] | None = None

    def _source_of_draw(self, draw: int) -> int:
        if len(self.sizes) == 1:
            return 0
        block = draw // _CHOICE_BLOCK
        if self._choices is None or self._choices[0] != block:
            rng = np.random.default_rng([self.seed, _MIX_STREAM, block])
            self._choices = (block, rng.choice(len(self.sizes), size=_CHOICE_BLOCK,
                                               p=self.probabilities))
        return int(self._choices[1][draw % _CHOICE_BLOCK])

    def _order(self, source: int, epoch: int) -> np.ndarray | None:
        if not self.shuffle:
            return None
        key = (source, epoch)
        if key not in self._orders:
            self._orders = {k: v for k, v in self._orders.items() if k[0] != source}
            rng = np.random.default_rng([self.seed, source, epoch])
            self._orders[key] = rng.permutation(self.sizes[source])
        return self._orders[key]

    def exhausted(self) -> bool:
        return self.finite and self.epochs[0] > 0

    def peek(self) -> tuple[int, int] | None:
        """The next ``(source, example index)``, or None when a finite stream is done."""
        if self.exhausted():
            return None
        source = self._source_of_draw(self.draws)
        order = self._order(source, self.epochs[source])
        position = self.indices[source]
        return source, int(order[position]) if order is not None else position

    def advance(self) -> None:
        """Consume the pair ``peek`` returned."""
        source = self._source_of_draw(self.draws)
        self.draws += 1
        self.indices[source] += 1
        if self.indices[source] == self.sizes[source]:
            self.indices[source] = 0
            self.epochs[source] += 1

    def take(self) -> tuple[int, int] | None:
        pair = self.peek()
        if pair is not None:
            self.advance()
        return pair

    def state_dict(self) -> dict[str, Any]:
        """The exact position: plain ints and lists (JSON-safe)."""
        return {"draws": self.draws, "epochs": list(self.epochs), "indices": list(self.indices),
                "sizes": list(self.sizes), "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["sizes"]) != self.sizes or state["seed"] != self.seed \
                or bool(state["shuffle"]) != self.shuffle:
            raise DataError("the data position saved in the checkpoint does not match these "
                            f"data sources (sizes {state['sizes']} vs {self.sizes}, seed "
                            f"{state['seed']} vs {self.seed}); the data or data config changed")
        self.draws = int(state["draws"])
        self.epochs = [int(e) for e in state["epochs"]]
        self.indices = [int(i) for i in state["indices"]]


def fill_value(field: str) -> int:
    """What a field means when a source lacks it: masks are all ones, the rest zeros."""
    return 1 if field.endswith("mask") else 0


def fill_columns(records_columns: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Prompt columns as lists (the reward-function kwargs), over the union of names.

    A row whose source lacks a column gets None there: there is no meaningful zero for
    an arbitrary column, and None fails loudly instead of scoring against a fake value.
    """
    names: list[str] = []
    for columns in records_columns:
        names.extend(name for name in columns if name not in names)
    return {name: [columns.get(name) for columns in records_columns] for name in names}
