"""TensorBoard: event files under ``<output_dir>/tensorboard`` (or ``log_dir``).

Metric names are TensorBoard tags as they are (``eval/accuracy`` groups under ``eval``);
values are stored in double precision, the numbers of metrics.jsonl.
A resumed run writes into the same directory and purges the events an earlier attempt
wrote after the checkpoint it resumes from; a fresh run (``--overwrite``) purges an
earlier run's events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from astrai_core.trackers.base import TrackedRun, Tracker, TrackerOptions, samples_markdown


class TensorBoard(Tracker):
    """Scalars to TensorBoard event files, the config as a text summary."""

    class Config(TrackerOptions):
        log_dir: str | None = Field(None, description="event file directory; default "
                                    "<output_dir>/tensorboard")

    requires = ("tensorboard",)
    install = "astrai-core[tensorboard]"

    def start(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(self.options.log_dir) if self.options.log_dir else \
            run.output_dir / "tensorboard"
        # A resume drops what an earlier attempt wrote after its checkpoint; a fresh run
        # (--overwrite) everything an earlier run wrote in the same directory.
        purge = run.resume_step + 1 if run.resume_step is not None else 1  # 0: no marker
        self.writer: Any = SummaryWriter(log_dir=str(log_dir), purge_step=purge)
        if not run.resumed:
            config = json.dumps(run.config, indent=2)
            self.writer.add_text("config", f"```\n{config}\n```", 0)
            if self.options.tags:
                self.writer.add_text("tags", ", ".join(self.options.tags), 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():  # as float64 tensors: the numbers of metrics.jsonl
            self.writer.add_scalar(name, value, step, new_style=True, double_precision=True)

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text("rollout/samples", samples_markdown(samples), step)

    def close(self, status: str) -> None:
        self.writer.close()
