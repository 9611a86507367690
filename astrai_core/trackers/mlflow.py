"""MLflow: one MLflow run per astrai run, continued on ``--resume``.

The store is ``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a file store at
``<output_dir>/mlruns``: MLflow's own default (``sqlite:///mlflow.db``) needs SQLAlchemy,
which the ``mlflow-skinny`` client does not install, and MLflow 3 opens a file store only
with ``MLFLOW_ALLOW_FILE_STORE=true``, which is set for the run when the store is one.
:meth:`MLflow.check` refuses, before the model loads, a database store the installed
client cannot open and a server that cannot be reached.

``project`` is the experiment (created when missing); the run id is stored in
``<output_dir>/trackers/mlflow.json``. The config goes in as parameters (dotted names,
values as text). Metric names keep their ``/`` except on a local file store, which keeps
each metric as a file named after it: there ``eval/reward`` (a file) and
``eval/reward/exact_match`` (under a folder of the same name) cannot both exist, so on a
file store every ``/`` becomes ``.``. Characters MLflow refuses become ``_``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field

from astrai_core.log import get_logger
from astrai_core.trackers.base import TrackedRun, Tracker, TrackerOptions, flatten

_REFUSED = re.compile(r"[^\w\-. /:]")  # what MLflow accepts in a metric or parameter name
_PARAM_CHARS = 6000  # MLflow's longest parameter value
_BATCH = 100  # parameters per log_batch call
STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # SQLAlchemy stores
_PROBE_SECONDS = 3.0


class MLflow(Tracker):
    """Config as parameters and metrics, through ``MlflowClient``."""

    class Config(TrackerOptions):
        tracking_uri: str | None = Field(
            None, description="server or store; default: MLFLOW_TRACKING_URI, else a file "
            "store at <output_dir>/mlruns")

    requires = ("mlflow",)
    install = "astrai-core[mlflow]"

    def store_uri(self, output_dir: Path) -> str:
        """The tracking store this run writes to (see the module docstring)."""
        return (self.options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                or (Path(output_dir).resolve() / "mlruns").as_uri())

    def check(self, output_dir: Path) -> None:
        """ValueError, in one line, when the store cannot be opened from here."""
        uri = self.store_uri(output_dir)
        scheme = urlsplit(uri).scheme.split("+")[0]
        if scheme in _DATABASES and importlib.util.find_spec("sqlalchemy") is None:
            raise ValueError(f"tracking_uri {uri!r} is a database store, which the installed "
                             "MLflow client cannot open without SQLAlchemy (pip install mlflow); "
                             "or use a tracking server (http://...), or leave tracking_uri out "
                             "for a file store under output_dir")
        if scheme in ("http", "https"):
            parts = urlsplit(uri)
            port = parts.port or (443 if scheme == "https" else 80)
            try:
                socket.create_connection((parts.hostname or "", port), _PROBE_SECONDS).close()
            except OSError as exc:
                raise ValueError(f"cannot reach the MLflow server at {uri}: "
                                 f"{exc.strerror or exc}") from None

    def start(self, run: TrackedRun) -> None:
        from mlflow.tracking import MlflowClient

        uri = self.store_uri(run.output_dir)
        if _file_store(uri):  # MLflow 3 refuses a file store unless this is set
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if uri != (self.options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
            get_logger("astrai.trackers").info("mlflow writes to a file store", tracking_uri=uri)
        self.client: Any = MlflowClient(tracking_uri=uri)
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

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=STATUS.get(status, "FAILED"))


def _file_store(uri: str) -> bool:
    """A local file store: ``file:`` URIs and plain paths."""
    return uri.startswith("file:") or "://" not in uri
