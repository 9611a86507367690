"""What every rank script under ``python -m torch.distributed.run`` (the ``*_worker.py``
files here) ends with: its result written as ``rank<N>.json``, and an exit that skips the
interpreter's teardown."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_rank_result(out_dir: Path, rank: int, result: Any) -> None:
    """``result`` as ``out_dir/rank<rank>.json``; then the process group is taken down."""
    import torch.distributed as dist

    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run_worker(main: Callable[[Path], None]) -> None:
    """``main(out_dir)`` with the directory the test passed, then leave with ``os._exit``:
    gloo sometimes aborts the interpreter's teardown (signal 6)."""
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
