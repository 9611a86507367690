"""Batch sources: where each optimizer step's micro-batches come from.

A strategy hands the trainer one source; the trainer asks it for one step's micro-batches
at a time (``next_step()``: a list of ``trainer.grad_accum_steps`` of them) and saves its
``state_dict()`` in every checkpoint, so a resume continues at the very next step.

* :class:`LoaderSource`: offline data, one loader batch per micro-batch.
* :class:`~astrai_core.online.source.RolloutSource`: the online schedule (rollouts drawn,
  processed once, served as optimizer steps).
"""

from __future__ import annotations

from typing import Any, Protocol

TENSORS = "tensors"  # the key of a source state whose tensors go to safetensors


class BatchSource(Protocol):
    """What the trainer needs from a source."""

    stats: dict[str, float]  # metrics of the data behind the last step (rollout statistics)

    def next_step(self) -> list[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LoaderSource:
    """``micro_batches`` consecutive loader batches per optimizer step."""

    def __init__(self, loader: Any, micro_batches: int) -> None:
        self.loader = loader
        self.micro_batches = micro_batches
        self.stats: dict[str, float] = {}
        self._batches: Any = None

    def next_step(self) -> list[Any]:
        if self._batches is None:  # made late, so that a resumed position applies
            self._batches = iter(self.loader)
        return [next(self._batches) for _ in range(self.micro_batches)]

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["data"])
        self._batches = None
