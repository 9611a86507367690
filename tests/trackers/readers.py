"""Read each tracker's offline files back, independently of the tracker that wrote them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

Series = dict[str, dict[int, float]]  # metric -> step -> value


def jsonl_series(run_dir: Path) -> Series:
    """metrics.jsonl as series (nulls left out: trackers get finite numbers only)."""
    series: Series = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        for name, value in record.items():
            if value is not None:
                series.setdefault(name, {})[step] = float(value)
    return series


def tensorboard_series(log_dir: Path) -> Series:
    """Scalars as the TensorBoard server reads them (its plugin EventAccumulator, which
    applies a restarted writer's purge)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    series: Series = {}
    for tag in events.Tags()["tensors"]:  # double-precision scalars; the config is text
        values = {e.step: make_ndarray(e.tensor_proto) for e in events.Tensors(tag)}
        if all(v.shape == () and v.dtype.kind == "f" for v in values.values()):
            series[tag] = {step: float(v) for step, v in values.items()}
    return series


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of an offline ``.wandb`` file (W&B's LevelDB-style log:
    a 7-byte header, then 32 KiB blocks of chunks ``<crc32:4><length:2><type:1><data>``)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a .wandb file"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: one whole record
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def wandb_series(run_dir: Path) -> tuple[Series, dict[str, Any]]:
    """(the history, the config) of the offline W&B runs under ``run_dir/wandb``."""
    series: Series = {}
    config: dict[str, Any] = {}
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                         for i in record.history.item}
                step = int(items.pop("_step"))
                for name, value in items.items():
                    if not name.startswith("_"):
                        series.setdefault(name, {})[step] = float(value)
            elif kind == "run":
                for item in record.run.config.update:
                    config[item.key] = json.loads(item.value_json)
    return series, config


def mlflow_series(tracking_uri: str, run_id: str) -> tuple[Series, dict[str, str], str]:
    """(metrics, params, status) of an MLflow run, through MlflowClient."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    series = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)}
              for key in run.data.metrics}
    return series, dict(run.data.params), run.info.status


def trackio_series(project: str, run: str) -> Series:
    """A local Trackio run's logs through Trackio's own storage (TRACKIO_DIR)."""
    from trackio.sqlite_storage import SQLiteStorage

    series: Series = {}
    for entry in SQLiteStorage.get_logs(project, run):
        step = int(entry["step"])
        for name, value in entry.items():
            if name not in ("step", "timestamp") and isinstance(value, (int, float)):
                series.setdefault(name, {})[step] = float(value)
    return series
