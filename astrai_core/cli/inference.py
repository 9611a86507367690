"""A native checkpoint loaded for inference, shared by `generate`, `eval` and `serve`: the
model on the chosen device, and its tokenizer. The imports sit inside the function, so a
command that merely parses its arguments never imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_model_and_tokenizer(model_dir: Path, device_name: str,
                             registry: Any = None) -> tuple[Any, Any]:
    """The checkpoint's model moved to ``device_name``'s device (resolved through
    ``registry``, the process's own by default), and its tokenizer."""
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.devices.select import resolve_device
    from astrai_core.errors import CheckpointError, DataError
    from astrai_core.plugins import process_registry

    model = load_pretrained(model_dir)  # CheckpointError names the problem
    try:
        tokenizer = load_tokenizer(model_dir)
    except DataError as err:
        raise CheckpointError(f"{model_dir} has no usable tokenizer: {err}") from None
    device = resolve_device(registry or process_registry(), device_name).device()
    return model.to(device), tokenizer
