"""Reading torch.distributed.checkpoint (DCP) directories without running their code.

DCP's own reader unpickles ``.metadata`` with :func:`pickle.load`, and its load planner
reads each non-tensor item with ``torch.load(weights_only=False)``: a checkpoint from
someone else could run any code during ``--resume``. Here the metadata goes through an
unpickler that builds only the classes a DCP metadata file holds (listed below), and
non-tensor items through ``torch.load(weights_only=True)``, PyTorch's restricted unpickler.
Both still run only after the checkpoint's manifest has verified
(:mod:`astrai_core.checkpoints.manifest`).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

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


class SafeReader(FileSystemReader):
    """DCP's file reader, with the metadata read by the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_dcp_metadata(stream.read(), str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


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
