"""The launch's world size, read from torchrun's environment (torch-free: the run plan
checks a config for it before anything heavy is imported)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def launched_world_size() -> int:
    """The number of processes torchrun started (1 outside torchrun)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


@contextlib.contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ`` for the duration, the previous ones put back after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
