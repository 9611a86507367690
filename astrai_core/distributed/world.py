"""The launch's world size, read from torchrun's environment (torch-free: the run plan
checks a config for it before anything heavy is imported)."""

from __future__ import annotations

import os


def launched_world_size() -> int:
    """The number of processes torchrun started (1 outside torchrun)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1
