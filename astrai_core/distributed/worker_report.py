"""What each process of a distributed run leaves for its launcher, so that a failure is
pinned on the right rank with the right words.

torchrun gives every process it starts a file of its own for its error
(``TORCHELASTIC_ERROR_FILE``, in torchrun's log directory). A process that fails writes
there the one line it printed, and whether it merely lost a peer (a collective failed or
timed out because another rank was gone or stuck). Beside it, ``progress.json`` records
how far the process got (each step begun and finished): when a rank freezes, its peers
time out in their next collective and fail first, and only the progress shows which rank
stopped moving. Outside torchrun every function here does nothing.

(torch-free: imported by the CLI before anything heavy.)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_core.distributed.world import launched_world_size

ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"  # torchrun's: where this process reports its error
PROGRESS_FILE = "progress.json"
LOST_PEER = "astrai_lost_peer"  # our key in torchrun's error file


def launched_worker() -> bool:
    """Whether this process is one of several that torchrun started."""
    return launched_world_size() > 1 and "TORCHELASTIC_RUN_ID" in os.environ


def _report_dir() -> Path | None:
    where = os.environ.get(ERROR_FILE_VAR) if launched_worker() else None
    return Path(where).parent if where else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Written aside then renamed, so a reader never sees half a file; a report that
    cannot be written is not worth failing the run for."""
    staging = path.with_name(f".{path.name}.tmp")
    try:
        staging.write_text(json.dumps(data))
        os.replace(staging, path)
    except OSError:
        pass


def record_error(message: str, *, lost_peer: bool = False) -> None:
    """Tell the launcher this process's error (its one line), in torchrun's error-file
    format; ``lost_peer``: it failed only because another rank failed or froze."""
    where = os.environ.get(ERROR_FILE_VAR) if launched_worker() else None
    if where:
        _write_json(Path(where), {"message": message, "timestamp": str(int(time.time())),
                                  LOST_PEER: lost_peer})


class RankProgress:
    """Records, for the launcher, each step this process begins and finishes."""

    def __init__(self, directory: Path | None = None) -> None:
        self.path = directory / PROGRESS_FILE if directory is not None else None

    @classmethod
    def of_this_process(cls) -> RankProgress:
        return cls(_report_dir())

    def began(self, step: int) -> None:
        self._write(2 * step - 1, f"in step {step}")

    def finished(self, step: int) -> None:
        self._write(2 * step, f"after step {step}")

    def _write(self, progress: int, where: str) -> None:
        if self.path is not None:
            _write_json(self.path, {"progress": progress, "where": where, "time": time.time()})


# -- the launcher's side -----------------------------------------------------------------
@dataclass(frozen=True)
class Ending:
    """How one process of a failed run ended, as its launcher saw it."""

    code: int                 # exit status; -N: killed by signal N
    timestamp: int            # when (whole seconds; from its error file when it wrote one)
    error: str | None = None  # the one line it reported
    lost_peer: bool = False   # it failed only because another rank did
    progress: int | None = None
    where: str = ""           # where it last made progress: "in step 3", "after step 2"


def ending_of(failure: Any, log_dir: Path | None) -> Ending:
    """An :class:`Ending` from torchrun's ``ProcessFailure`` and the progress file the
    process left in ``log_dir`` (torchrun's ``--log-dir``)."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message")
    if message == "<NONE>":  # torchrun's placeholder where the process left no error file
        message = None
    progress: dict[str, Any] = {}
    if log_dir is not None:
        # <log_dir>/<run id>/attempt_<n>/<local rank>/: one run, one attempt per launch
        for path in sorted(log_dir.glob(f"*/attempt_*/{failure.local_rank}/{PROGRESS_FILE}")):
            try:
                progress = json.loads(path.read_text())
            except (OSError, ValueError):
                progress = {}
    return Ending(code=failure.exitcode, timestamp=int(failure.timestamp),
                  error=message.strip() if isinstance(message, str) and message.strip() else None,
                  lost_peer=bool(data.get(LOST_PEER)),
                  progress=progress.get("progress") if isinstance(progress, dict) else None,
                  where=str(progress.get("where", "")) if isinstance(progress, dict) else "")
