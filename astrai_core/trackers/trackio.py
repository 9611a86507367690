"""Trackio: a run in a local Trackio project (``TRACKIO_DIR``, default under the Hugging
Face cache), or on a Hugging Face Space or self-hosted server with ``space_id`` or
``server_url``.

Trackio names runs, so a resumed run continues the run of the same name
(``resume="allow"``); the name is stored in ``<output_dir>/trackers/trackio.json``.
Metric names go as they are. ``trackio show`` opens the dashboard.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from astrai_core.trackers.base import SAMPLE_COLUMNS, TrackedRun, Tracker, TrackerOptions


class Trackio(Tracker):
    """Config and metrics to a Trackio run."""

    class Config(TrackerOptions):
        space_id: str | None = Field(None, description="a Hugging Face Space (user/name) to "
                                     "log to; default: local only")
        server_url: str | None = Field(None, description="a self-hosted Trackio server")
        group: str | None = Field(None, description="groups runs in the dashboard")
        system_metrics: bool = Field(False, description="also let Trackio sample CPU/GPU "
                                     "use in the background")

        @field_validator("tags")
        @classmethod
        def _no_tags(cls, value: list[str]) -> list[str]:
            if value:
                raise ValueError("Trackio runs have no tags; use `group`")
            return value

    requires = ("trackio",)
    install = "astrai-core[trackio]"

    def start(self, run: TrackedRun) -> None:
        import trackio

        name = run.saved_id() or self.options.run_name or run.default_name
        self.run: Any = trackio.init(
            project=self.options.project or run.default_name, name=name,
            group=self.options.group, space_id=self.options.space_id,
            server_url=self.options.server_url, config=run.config,
            resume="allow" if run.resumed else "never", embed=False,
            auto_log_cpu=self.options.system_metrics, auto_log_gpu=self.options.system_metrics)
        run.save_id(name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        import trackio

        table = trackio.Table(columns=list(SAMPLE_COLUMNS),
                              data=[[s[c] for c in SAMPLE_COLUMNS] for s in samples])
        self.run.log({"rollout/samples": table}, step=step)

    def close(self, status: str) -> None:
        self.run.finish()
