"""Sources read through Hugging Face ``datasets``: Parquet, JSON, CSV, Arrow files, a
``save_to_disk`` directory or a hub dataset (``hf://NAME`` with ``split`` and ``subset``),
with ``columns`` renames and a ``transform`` applied to each row.

Such a source is turned once into a JSONL file of checked rows under
``<cache_dir>/sources/``, named after a key that hashes the dataset's fingerprint, the
renames, the transform and the format; the tokenization cache, mixing, packing and the
resumable loaders then read that file like any JSONL source. A row that fails its
format check is an error naming the source and the row's index (0-based, as ``datasets``
counts). A plain ``.jsonl`` file without renames or transform is read directly (faster:
see docs/data-sources.md).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astrai_core.data.sources import ROW_VALIDATORS, RowError
from astrai_core.errors import DataError
from astrai_core.log import get_logger

log = get_logger(__name__)
HUB = "hf://"
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
            ".arrow": "arrow"}
_VERSION = 1  # bump when the rows written change


def is_hub(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(HUB)


def needs_datasets(source: Any) -> bool:
    """Whether ``source`` (a data.sources entry or data.eval) is read through ``datasets``."""
    path = source.path
    return (is_hub(path) or Path(path).suffix != ".jsonl" or Path(path).is_dir()
            or bool(source.renames) or source.transform is not None)


def materialize(source: Any, cache_dir: Path, field: str) -> Path:
    """The checked JSONL file of ``source``'s rows, written once per dataset fingerprint."""
    dataset = undecoded_images(_load(source, cache_dir, field))
    if source.renames:
        dataset = renamed(dataset, source.renames, field)
    transform = _import_transform(source.transform, field) if source.transform else None
    key = _key(dataset, source, transform)
    out = cache_dir / "sources" / f"{_stem(source.path)}-{source.format}-{key}.jsonl"
    if out.is_file():
        log.info("data source cache hit", source=str(source.path), entry=str(out))
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    validate = ROW_VALIDATORS[source.format]
    try:
        with staging.open("w", encoding="utf-8") as handle:
            for index, row in enumerate(dataset):
                row = _clean(row)
                try:
                    if transform is not None:
                        row = _transformed(transform, row, source.transform)
                    validate(row)
                except RowError as err:
                    raise DataError(f"data source {source.path}, row {index}: {err}") from None
                handle.write(json.dumps(row, default=json_value) + "\n")
        if len(dataset) == 0:
            raise DataError(f"{field}: data source has no rows: {source.path}")
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    log.info("data source read", source=str(source.path), rows=len(dataset), entry=str(out))
    return out


def first_row(source: Any, cache_dir: Path, field: str) -> dict:
    """The first row of ``source`` as its format check would see it (renamed, transformed),
    for ``format: auto``; a DataError when there is none."""
    if not needs_datasets(source):
        with Path(source.path).open("rb") as handle:
            for raw in handle:
                if raw.strip():
                    try:
                        row = json.loads(raw)
                    except ValueError as err:
                        raise DataError(f"data file {source.path}, line 1: invalid JSON "
                                        f"({err})") from None
                    return row if isinstance(row, dict) else {}
        raise DataError(f"{field}: data file has no rows: {source.path}")
    dataset = undecoded_images(_load(source, cache_dir, field))
    if source.renames:
        dataset = renamed(dataset, source.renames, field)
    if len(dataset) == 0:
        raise DataError(f"{field}: data source has no rows: {source.path}")
    row = _clean(dataset[0])
    if source.transform:
        try:
            row = _transformed(_import_transform(source.transform, field), row, source.transform)
        except RowError as err:
            raise DataError(f"data source {source.path}, row 0: {err}") from None
    return row


def undecoded_images(dataset: Any) -> Any:
    """``dataset`` with its Image columns (alone or in lists) as the stored files'
    ``{"bytes", "path"}``: the image processor opens them when rows are processed
    (data/images.py), and nothing is decoded and re-encoded on the way."""
    import datasets

    def undecode(feature: Any) -> Any:
        if isinstance(feature, datasets.Image):
            return datasets.Image(decode=False)
        if isinstance(feature, datasets.List):
            return datasets.List(undecode(feature.feature))
        if isinstance(feature, list):
            return [undecode(feature[0])]
        if isinstance(feature, dict):
            return {key: undecode(value) for key, value in feature.items()}
        return feature

    for name, feature in dataset.features.items():
        plain = undecode(feature)
        if plain != feature:
            dataset = dataset.cast_column(name, plain)
    return dataset


def json_value(value: Any) -> Any:
    """What a row's value that JSON has no type for is written as: bytes (an image's file)
    as base64 text, which data/images.py reads back; anything else as its text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _load(source: Any, cache_dir: Path, field: str) -> Any:
    try:
        import datasets
    except ImportError:  # pragma: no cover - a core dependency
        raise DataError(f"{field}: reading {source.path} needs the 'datasets' package: "
                        "pip install datasets") from None
    datasets.disable_progress_bars()
    path = source.path
    if is_hub(path):
        return _load_hub(datasets, source, path[len(HUB):], cache_dir, field)
    path = Path(path)
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if source.split not in loaded:
                    raise DataError(f"{field}: {path} has splits {', '.join(loaded)}, not "
                                    f"{source.split!r} (set `split`)")
                loaded = loaded[source.split]
            return loaded
        builder = BUILDERS.get(path.suffix)
        if builder is None:
            raise DataError(f"{field}: {path}: unknown data file type {path.suffix!r}; use "
                            f"{', '.join(BUILDERS)} or a save_to_disk directory")
        return datasets.load_dataset(builder, data_files=str(path), split="train",
                                     cache_dir=str(cache_dir / "hf"))
    except DataError:
        raise
    except Exception as exc:  # unreadable file: one line naming it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{field}: cannot read {path} ({type(exc).__name__}: {first})") from None


def _load_hub(datasets: Any, source: Any, name: str, cache_dir: Path, field: str) -> Any:
    """A hub dataset; the local cache only when the hub is offline or unreachable."""
    from astrai_core.data.hub import offline_unless_reachable

    with offline_unless_reachable() as offline:
        try:
            return datasets.load_dataset(name, source.subset, split=source.split,
                                         cache_dir=str(cache_dir / "hf"))
        except Exception as exc:  # offline, unknown name, unknown split/subset
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            state = f"{offline}: only the local cache was read; " if offline else ""
            raise DataError(
                f"{field}: hub dataset {name!r} (subset {source.subset!r}, split "
                f"{source.split!r}) cannot be loaded ({type(exc).__name__}: {first}); {state}"
                "without network, set HF_HUB_OFFLINE=1 and have it in the local Hugging Face "
                "cache (HF_HOME, or data.cache_dir/hf), or point `path` at its files") from None


def _clean(row: dict) -> dict:
    """Arrow gives every struct the union of its keys: drop the ``None`` ones of messages
    (a message without ``name`` stays without it)."""
    for key in ("messages", "prompt", "completion", "chosen", "rejected"):
        value = row.get(key)
        if isinstance(value, list):
            row[key] = [{k: v for k, v in m.items() if v is not None}
                        if isinstance(m, dict) else m for m in value]
    return row


def renamed(dataset: Any, renames: dict[str, str], field: str) -> Any:
    missing = [name for name in renames if name not in dataset.column_names]
    if missing:
        raise DataError(f"{field.rsplit('.', 1)[0]}.columns: no column {missing[0]!r} to rename; "
                        f"the columns are {', '.join(dataset.column_names)}")
    return dataset.rename_columns(renames)


def _import_transform(target: str, field: str) -> Callable[[dict], dict]:
    from astrai_core.plugins.specs import import_target

    try:
        function = import_target(target)
    except Exception as exc:
        raise DataError(f"{field.rsplit('.', 1)[0]}.transform: {target!r} cannot be imported "
                        f"({type(exc).__name__}: {exc})") from None
    if not callable(function):
        raise DataError(f"{field.rsplit('.', 1)[0]}.transform: {target!r} is not callable")
    return function


def _transformed(function: Callable[[dict], dict], row: dict, target: str) -> dict:
    try:
        out = function(dict(row))
    except Exception as exc:
        raise RowError(f"transform {target} failed ({type(exc).__name__}: {exc})") from None
    if not isinstance(out, dict):
        raise RowError(f"transform {target} returned {type(out).__name__}, not a dict")
    return out


def _key(dataset: Any, source: Any, transform: Callable | None) -> str:
    code = ""
    if transform is not None:
        try:
            code = inspect.getsource(transform)
        except (OSError, TypeError):
            code = source.transform
    identity = {"version": _VERSION, "fingerprint": dataset._fingerprint,
                "format": source.format, "transform": [source.transform, code]}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _stem(path: Any) -> str:
    if is_hub(path):
        return path[len(HUB):].replace("/", "__")
    return Path(path).stem or Path(path).name
