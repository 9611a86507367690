"""A native checkpoint loaded for inference, shared by `generate`, `eval` and `serve`: the
model on the chosen device, and its tokenizer. The imports sit inside the function, so a
command that merely parses its arguments never imports torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_verify_argument(parser: argparse.ArgumentParser) -> None:
    """``--verify`` / ``--no-verify`` (default: hash a small checkpoint)."""
    from astrai_core.checkpoints.manifest import HASH_BY_DEFAULT_BYTES

    parser.add_argument(
        "--verify", action=argparse.BooleanOptionalAction, default=None,
        help="check every file's sha256 against the checkpoint's manifest before loading "
             "(not only its size); default: on for checkpoints up to "
             f"{HASH_BY_DEFAULT_BYTES // 2**20} MiB, off above")


def load_model_and_tokenizer(model_dir: Path, device_name: str, registry: Any = None,
                             verify: bool | None = False) -> tuple[Any, Any]:
    """The checkpoint's model moved to ``device_name``'s device (resolved through
    ``registry``, the process's own by default), and its tokenizer. ``verify``: hash its
    files first (None: when it is small, see
    :func:`~astrai_core.checkpoints.manifest.hash_by_default`)."""
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.devices.select import resolve_device
    from astrai_core.errors import CheckpointError, DataError
    from astrai_core.plugins import process_registry

    # CheckpointError names the problem
    model = load_pretrained(model_dir, hashes=verify)
    try:
        tokenizer = load_tokenizer(model_dir)
    except DataError as err:
        raise CheckpointError(f"{model_dir} has no usable tokenizer: {err}") from None
    device = resolve_device(registry or process_registry(), device_name).device()
    return model.to(device), tokenizer
