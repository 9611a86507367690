"""Reading and writing the files of a Hugging Face checkpoint directory.

``config.json``, weights as one ``model.safetensors`` or shards listed in
``model.safetensors.index.json`` (the native checkpoint uses the same safetensors layout,
so :mod:`astrai_core.checkpoints.native_files` reads and writes the weight files), and a
destination that appears only when complete. Every problem a user can cause (missing
file, truncated shard, bad JSON) becomes one :class:`CheckpointError`. Weights never
go through pickle.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astrai_core.errors import CheckpointError

if TYPE_CHECKING:
    import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; a clear error when it is missing or malformed."""
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def read_hf_config(src_dir: Path) -> dict[str, Any]:
    """``config.json`` of a Hugging Face checkpoint directory."""
    if not src_dir.is_dir():
        raise CheckpointError(f"source {src_dir} is not a directory")
    path = src_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{src_dir} has no config.json: not a Hugging Face checkpoint "
                              "directory")
    return read_json(path)


def read_hf_weights(src_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors weights (one file or index + shards)."""
    from astrai_core.checkpoints.native_files import read_safetensors, weight_files

    check_safetensors(src_dir)
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(src_dir):
        tensors.update(read_safetensors(path))
    return tensors


def check_safetensors(src_dir: Path) -> None:
    """The directory holds safetensors weights; else one error (naming pickle files found,
    which astrai never reads)."""
    if not (src_dir / SINGLE_FILE).is_file() and not (src_dir / INDEX_FILE).is_file():
        pickled = sorted(p.name for p in src_dir.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (f" (found {', '.join(pickled)}: astrai reads safetensors only, never pickle "
                "files; re-save the model with transformers' save_pretrained)") if pickled else ""
        raise CheckpointError(f"{src_dir} has no weights: expected {SINGLE_FILE} or "
                              f"{INDEX_FILE}{hint}")


def check_destination_free(dst_dir: Path) -> None:
    """Refuse to write over anything: the user must choose a new directory."""
    if dst_dir.exists():
        raise CheckpointError(f"destination {dst_dir} already exists; choose a new directory or "
                              "remove it first")


@contextmanager
def staged_directory(dst_dir: Path) -> Iterator[Path]:
    """Yield a fresh path beside ``dst_dir`` to fill; rename it to ``dst_dir`` on success.

    The yielded path does not exist yet (so writers that refuse existing directories can
    create it). On any error everything staged is removed and ``dst_dir`` never appears.
    """
    check_destination_free(dst_dir)
    dst_dir.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{dst_dir.name}.", suffix=".partial",
                                   dir=dst_dir.parent))
    try:
        stage = holder / "staged"
        yield stage
        if not stage.is_dir():
            raise CheckpointError(f"nothing was written for {dst_dir}")
        check_destination_free(dst_dir)
        os.rename(stage, dst_dir)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
