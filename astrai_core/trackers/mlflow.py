"""MLflow: one MLflow run per astrai run, continued on ``--resume``.

``project`` is the experiment (created when missing); the run id is stored in
``<output_dir>/trackers/mlflow.json``. The config goes in as parameters (dotted names,
values as text). Metric names keep their ``/`` except on a local file store, which keeps
each metric as a file named after it: there ``eval/reward`` (a file) and
``eval/reward/exact_match`` (under a folder of the same name) cannot both exist, so on a
file store every ``/`` becomes ``.``. Characters MLflow refuses become ``_``.
"""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import Field

from astrai_core.trackers.base import (TrackedRun, Tracker, TrackerOptions, flatten,
                                      samples_markdown)

_REFUSED = re.compile(r"[^\w\-. /:]")  # what MLflow accepts in a metric or parameter name
_PARAM_CHARS = 6000  # MLflow's longest parameter value
_BATCH = 100  # parameters per log_batch call
STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


class MLflow(Tracker):
    """Config as parameters and metrics, through ``MlflowClient``."""

    class Config(TrackerOptions):
        tracking_uri: str | None = Field(
            None, description="server or store; default: MLflow's (MLFLOW_TRACKING_URI)")

    requires = ("mlflow",)
    install = "astrai-core[mlflow]"

    def start(self, run: TrackedRun) -> None:
        from mlflow.tracking import MlflowClient

        self.client: Any = MlflowClient(tracking_uri=self.options.tracking_uri)
        self.separator = "." if _file_store(self.client.tracking_uri) else "/"
        run_id = run.saved_id()
        if run_id is None:
            run_id = self._create(run)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        run.save_id(run_id)

    def _create(self, run: TrackedRun) -> str:
        from mlflow.entities import Param

        name = self.options.project or "Default"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(name))
        created = self.client.create_run(experiment_id,
                                         run_name=self.options.run_name or run.default_name,
                                         tags={tag: "true" for tag in self.options.tags})
        params = [Param(self.key(k), str(v)[:_PARAM_CHARS]) for k, v in flatten(run.config).items()]
        for first in range(0, len(params), _BATCH):
            self.client.log_batch(created.info.run_id, params=params[first:first + _BATCH])
        return created.info.run_id

    def key(self, name: str) -> str:
        """``name`` as MLflow accepts it on this store (see the module docstring)."""
        return _REFUSED.sub("_", name).replace("/", self.separator)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(self.key(k), v, now, step)
                                                    for k, v in metrics.items()])

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        self.client.log_text(self.run_id, samples_markdown(samples),
                             f"rollout_samples/step_{step:08d}.txt")

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=STATUS.get(status, "FAILED"))


def _file_store(uri: str) -> bool:
    """A local file store: ``file:`` URIs and plain paths."""
    return uri.startswith("file:") or "://" not in uri
