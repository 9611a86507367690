"""Reading torch.distributed.checkpoint (DCP) directories without running their code.

DCP's own reader unpickles ``.metadata`` with :func:`pickle.load`, and its load planner
reads each non-tensor item with ``torch.load(weights_only=False)``: a checkpoint from
someone else could run any code during ``--resume``. Here the metadata goes through an
unpickler that builds only the classes a DCP metadata file holds (listed below), and
non-tensor items through ``torch.load(weights_only=True)``, PyTorch's restricted unpickler.
Both still run only after the checkpoint's manifest has verified
(:mod:`astrai_core.checkpoints.manifest`).

The metadata also says where each item's bytes are: a file name, an offset and a length,
which DCP's reader would follow anywhere (an absolute path, ``/dev/zero`` with a length of
GBs). Before anything is read, each must name a file of ``dcp/`` that the manifest lists,
and lie within its size. Any failure while reading the items becomes one CheckpointError
naming the file.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.futures import Future

from astrai_core.checkpoints.manifest import require_listed
from astrai_core.errors import CheckpointError

# What torch.distributed.checkpoint pickles into .metadata (see save's metadata: the
# global shapes and dtypes of every entry, and where each chunk lives in which file).
_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),  # a lookup of torch.strided & co.
    "collections": frozenset({"OrderedDict"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # StorageMeta.checkpoint_id
    "builtins": frozenset({"set", "frozenset", "slice"}),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None),
                                            (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)  # torch.float32, torch.strided, ...: plain values
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")


def read_dcp_metadata(data: bytes, source: str) -> Metadata:
    """The Metadata pickled in ``data``; CheckpointError naming ``source`` otherwise."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed pickle: one message naming the file
        raise CheckpointError(f"{source} is not a checkpoint's DCP metadata ({exc}); "
                              "refusing to read it") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{source} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def check_storage(metadata: Metadata, dcp_dir: Path, source: str) -> None:
    """Every storage item of ``metadata`` names a file of ``dcp_dir`` that the checkpoint's
    manifest lists (``dcp_dir``'s parent), with its bytes within that file; CheckpointError
    naming ``source`` and the item otherwise. Nothing is read but the manifest."""
    sizes: dict[str, int] = {}
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        if not isinstance(info, _StorageInfo):
            raise CheckpointError(f"{source}: storage item {index} is a "
                                  f"{type(info).__name__}, not a file location")
        relative = info.relative_path
        if relative not in sizes:
            sizes[relative] = require_listed(dcp_dir.parent, relative, Path(source),
                                             under=dcp_dir.name)
        offset, length = info.offset, info.length
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                   for n in (offset, length)) or offset + length > sizes[relative]:
            raise CheckpointError(
                f"{source}: storage item {getattr(index, 'fqn', index)} lies outside its "
                f"file {dcp_dir / relative} (offset {offset!r}, length {length!r}, the "
                f"file has {sizes[relative]} bytes); refusing to read it")
        if info.transform_descriptors:  # astrai writes none (no compression)
            raise CheckpointError(f"{source}: storage item {getattr(index, 'fqn', index)} "
                                  f"asks for transforms {info.transform_descriptors!r}")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


class SafeReader(FileSystemReader):
    """DCP's file reader, with the metadata read by the restricted unpickler, its storage
    items checked against the checkpoint's manifest, and each file's read failures one
    CheckpointError naming the file."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_dcp_metadata(stream.read(), str(path))
        check_storage(metadata, Path(self.path), str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Future:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                []).append(item)
        for relative, items in per_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except CheckpointError:
                raise
            except Exception as exc:  # a hostile item: torch.load, a shape, a short read
                raise CheckpointError(f"{Path(self.path) / relative}: cannot read the "
                                      f"checkpoint's state ({_first_line(exc)})") from None
        done: Future = Future()
        done.set_result(None)
        return done


def unwrap_failure(error: BaseException) -> BaseException:
    """The CheckpointError inside DCP's CheckpointException (which collects each rank's
    exception and prints their tracebacks), else ``error`` itself."""
    for failure in (getattr(error, "failures", None) or {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
    return error


class _SafeBytes:
    """Non-tensor items read by ``torch.load(weights_only=True)`` (DCP's own planners use
    ``weights_only=False``); mixed into a DCP load planner."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(_SafeBytes, DefaultLoadPlanner):
    """DCP's load planner (into a given state dict), reading nothing that runs code."""


class SafeWholeLoadPlanner(_SafeBytes, _EmptyStateDictLoadPlanner):
    """DCP's planner that loads a whole checkpoint into an empty dict, likewise."""
