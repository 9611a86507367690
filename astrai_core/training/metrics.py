"""metrics.jsonl (one JSON object per logged step) and per-step throughput."""

from __future__ import annotations

import errno
import json
import math
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from astrai_core.errors import AstraiError


def to_number(value: Any) -> float | int:
    """A metric value as a plain number (tensors are read once here, not per micro-batch)."""
    if hasattr(value, "item"):
        value = value.item()
    return value


class MetricsLog:
    """Appends one line per logged step to ``<output_dir>/metrics.jsonl``."""

    def __init__(self, output_dir: Path, resume_step: int | None) -> None:
        self.path = output_dir / "metrics.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            self._truncate_after(resume_step)

    def _truncate_after(self, step: int) -> None:
        # A run that died after its last checkpoint logged steps that the resumed run
        # will log again; keep only what the checkpoint had seen. Written aside, then
        # renamed: a failure (a full disk) leaves the old file whole and no aside.
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        staging = self.path.with_name(f".{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with _disk_errors(self.path):
                staging.write_text("".join(line + "\n" for line in kept))
                os.replace(staging, self.path)
        finally:
            staging.unlink(missing_ok=True)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step}
        for name, value in metrics.items():
            number = to_number(value)
            record[name] = None if isinstance(number, float) and not math.isfinite(number) else number
        with _disk_errors(self.path), self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()


@contextmanager
def _disk_errors(path: Path) -> Iterator[None]:
    """A full disk (or quota) while writing ``path`` as one error naming it."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise AstraiError(f"no space left on the device of {path.parent} while writing "
                          f"{path.name} ({error.strerror}); free some space and run again"
                          ) from None


class Throughput:
    """Wall time and tokens per second of one optimizer step (generation included; the
    trainer starts one per step, so evaluation and saving are not charged to a step)."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def lap(self, tokens: float) -> tuple[float, float]:
        """(seconds since the previous lap, tokens per second over them)."""
        now = time.perf_counter()
        seconds = max(now - self._start, 1e-9)
        self._start = now
        return seconds, tokens / seconds
