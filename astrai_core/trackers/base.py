"""What a tracker is given (:class:`TrackedRun`) and the base class of the built-in ones."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

STATUSES = ("finished", "failed", "interrupted")


@dataclass(frozen=True)
class TrackedRun:
    """One run as a tracker sees it.

    ``config`` is the resolved run config (JSON values); ``resume_step`` is the checkpoint
    step a resumed run continues from (None for a fresh run): the steps after it that an
    earlier attempt logged will be logged again.
    """

    tracker: str
    config: dict[str, Any]
    output_dir: Path
    resume_step: int | None = None

    @property
    def resumed(self) -> bool:
        return self.resume_step is not None

    @property
    def default_name(self) -> str:
        """The run's name when the entry gives none: the output directory's name."""
        return self.output_dir.resolve().name

    @property
    def state_path(self) -> Path:
        return self.output_dir / "trackers" / f"{self.tracker}.json"

    def saved_id(self) -> str | None:
        """The backend's run id an earlier attempt of this run stored; None for a fresh run
        (``--overwrite`` starts a new backend run)."""
        if self.resume_step is None:
            return None
        try:
            return json.loads(self.state_path.read_text()).get("run_id")
        except (OSError, ValueError):
            return None

    def save_id(self, run_id: str) -> None:
        """Store the backend's run id in the run directory, so a resume continues that run."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.state_path.with_suffix(".json.tmp")
        staging.write_text(json.dumps({"run_id": run_id}) + "\n")
        os.replace(staging, self.state_path)


class TrackerOptions(BaseModel):
    """The options every built-in tracker takes."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(None, description="project (MLflow: experiment) the run "
                                "belongs to; default: the backend's own default")
    run_name: str | None = Field(None, description="the run's name; default: the name of "
                                 "output_dir")
    tags: list[str] = Field(default_factory=list, description="labels attached to the run")


class Tracker:
    """Base of the built-in trackers: options validated by ``Config``, kept in ``options``."""

    Config: ClassVar[type[TrackerOptions]] = TrackerOptions
    requires: ClassVar[tuple[str, ...]] = ()
    install: ClassVar[str] = ""

    def __init__(self, **options: Any) -> None:
        self.options = self.Config(**options)

    def check(self, output_dir: Path) -> None:
        """Raise ValueError with a one-line reason when the tracker cannot start for a run
        writing to ``output_dir`` (a store it cannot open, a server it cannot reach); the
        run plan calls it before the model loads. Default: nothing to check."""

    def start(self, run: TrackedRun) -> None:
        raise NotImplementedError

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        raise NotImplementedError


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a logged step (metrics.jsonl writes the others as null)."""
    out = {}
    for name, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[name] = float(value)
    return out


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trainer": {"lr": 1e-4}}`` -> ``{"trainer.lr": 1e-4}`` (lists kept whole)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
