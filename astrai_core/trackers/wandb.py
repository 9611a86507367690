"""Weights & Biases: one W&B run per astrai run, continued on ``--resume``.

The W&B run id is stored in ``<output_dir>/trackers/wandb.json``; a resumed run passes it
back with ``resume="allow"``. Metric names go as they are (W&B groups them by their
``eval/`` prefix). ``mode: offline`` (or ``WANDB_MODE=offline``) writes the run under
``<output_dir>/wandb`` for a later ``wandb sync``.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import Field

from astrai_core.trackers.base import SAMPLE_COLUMNS, TrackedRun, Tracker, TrackerOptions


class WandB(Tracker):
    """Config and metrics to a W&B run."""

    class Config(TrackerOptions):
        entity: str | None = Field(None, description="team or user; default: W&B's default")
        group: str | None = Field(None, description="groups runs in the W&B interface")
        mode: Literal["online", "offline", "disabled"] | None = Field(
            None, description="default: W&B's (WANDB_MODE, else online)")
        dir: str | None = Field(None, description="where W&B keeps its files; default "
                                "<output_dir>")

    requires = ("wandb",)
    install = "astrai-core[wandb]"

    def start(self, run: TrackedRun) -> None:
        import wandb

        run_id = run.saved_id() or uuid.uuid4().hex[:8]  # W&B ids: 8 of [a-z0-9]
        self.run: Any = wandb.init(
            project=self.options.project, entity=self.options.entity,
            name=self.options.run_name or run.default_name, tags=self.options.tags or None,
            group=self.options.group, mode=self.options.mode,
            dir=self.options.dir or str(run.output_dir), id=run_id, resume="allow",
            config=run.config, reinit="create_new")
        run.save_id(run_id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        import wandb

        table = wandb.Table(columns=list(SAMPLE_COLUMNS),
                            data=[[s[c] for c in SAMPLE_COLUMNS] for s in samples])
        self.run.log({"rollout/samples": table}, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)
