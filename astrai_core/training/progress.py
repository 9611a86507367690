"""What a run shows while it trains: a live bar on a terminal, heartbeat lines elsewhere.

On a terminal (the shared console of :mod:`astrai_core.log` is one), a rich progress bar
shows step, loss, tokens/s and ETA, evaluation adds its own transient bar, and log lines
print above them. Off a terminal (CI, nohup, ``| tee``) nothing redraws: a heartbeat
log line every ``heartbeat_seconds`` gives step, loss, tokens/s and ETA (also on a
terminal when ``trainer.progress`` turns the bar off). Either way each
evaluation's metrics are logged when it finishes and a summary closes the run. The clock
is injectable so that tests need no timing.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from astrai_core.log import console, get_logger

log = get_logger("astrai.progress")
Clock = Callable[[], float]


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


def _rounded(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}


class Heartbeat:
    """A log line at most every ``every`` seconds: step, loss, tokens/s (since the last
    line) and ETA (from the mean step time since the start)."""

    def __init__(self, every: float, total: int, start: int, clock: Clock) -> None:
        self.every, self.total, self.clock = every, total, clock
        self._start_step, self._started = start, clock()
        self._last, self._tokens = self._started, 0.0

    def step(self, step: int, loss: float, tokens: float) -> bool:
        """Count ``tokens``; log a line when one is due. Returns whether it logged."""
        self._tokens += tokens
        now = self.clock()
        if now - self._last < self.every:
            return False
        per_step = (now - self._started) / max(step - self._start_step, 1)
        log.info("progress", step=step, max_steps=self.total, loss=round(loss, 4),
                 tokens_per_s=round(self._tokens / max(now - self._last, 1e-9), 1),
                 eta=_duration(per_step * (self.total - step)))
        self._last, self._tokens = now, 0.0
        return True


class _Bar:
    """The rich training bar and, during evaluation, a transient evaluation bar."""

    def __init__(self, total: int, start: int) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeRemainingColumn)

        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                            TimeRemainingColumn(), console=console(), transient=False)
        self.train = self.bar.add_task("train", total=total, completed=start, status="")
        self.eval: Any = None
        self.bar.start()

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        self.bar.update(self.train, completed=step, refresh=True,
                        status=f"loss {loss:.4f}  {tokens_per_s:,.0f} tok/s")

    def eval_progress(self, done: int, total: int | None) -> None:
        if self.eval is None:
            self.eval = self.bar.add_task("eval", total=total, status="")
        self.bar.update(self.eval, completed=done, total=total, refresh=True)

    def eval_done(self) -> None:
        if self.eval is not None:
            self.bar.remove_task(self.eval)
            self.eval = None


class RunReporter:
    """The trainer's one place for progress, evaluation results and the final summary."""

    def __init__(self, total: int, start: int, *, bar: bool, heartbeat_seconds: float,
                 clock: Clock = time.monotonic) -> None:
        self.total, self.clock = total, clock
        self.started = clock()
        terminal = console().is_terminal
        self._bar = _Bar(total, start) if bar and terminal else None
        self._heartbeat = (Heartbeat(heartbeat_seconds, total, start, clock)  # no bar: beat
                           if self._bar is None and heartbeat_seconds > 0 else None)

    def step(self, step: int, loss: float, tokens: float, tokens_per_s: float) -> None:
        if self._bar is not None:
            self._bar.step(step, loss, tokens_per_s)
        if self._heartbeat is not None:
            self._heartbeat.step(step, loss, tokens)

    def eval_progress(self, done: int, total: int | None) -> None:
        """Called by the evaluation after each batch (``total`` None when unknown)."""
        if self._bar is not None:
            self._bar.eval_progress(done, total)

    def eval_finished(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._bar is not None:
            self._bar.eval_done()
        if metrics:
            log.info("evaluation", step=step, **_rounded(metrics))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.bar.stop()

    def summary(self, *, steps: int, last: Mapping[str, Any], evaluation: Mapping[str, Any],
                checkpoint: Path | None) -> dict[str, Any]:
        """Print the end-of-run summary (a table on a terminal, a log line elsewhere)."""
        loss = last.get("loss")
        fields = {"steps": steps, "wall_time": _duration(self.clock() - self.started),
                  "last_loss": round(float(loss), 4) if loss is not None else None,
                  **_rounded(evaluation), "checkpoint": str(checkpoint) if checkpoint else None}
        if console().is_terminal:
            from rich.table import Table

            table = Table(title="run finished", show_header=False, title_justify="left")
            for name, value in fields.items():
                table.add_row(name, "-" if value is None else str(value))
            console().print(table)
        else:
            log.info("run finished", **fields)
        return fields
