"""The run's report: metrics.jsonl first, then every tracker of `trainer.report_to`.

Rank 0 alone builds one; the trainer writes each logged step through it and closes it
once, whatever ends the run (the last step, an error, a signal). A tracker that fails
while logging is warned about and dropped: metrics.jsonl, written first, keeps the run's
record, and a dashboard outage must not end a long run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from astrai_core.errors import AstraiError
from astrai_core.log import get_logger
from astrai_core.trackers.base import TrackedRun, scalars

log = get_logger("astrai.trackers")


class TrackerError(AstraiError):
    """A tracker could not start."""


class RunReport:
    """``write(step, metrics)`` to metrics.jsonl and the trackers; ``close(status)`` once."""

    def __init__(self, metrics_log: Any, trackers: Sequence[tuple[str, Any]] = ()) -> None:
        self.metrics_log = metrics_log
        self.trackers = list(trackers)
        self.closed = False

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.metrics_log.write(step, metrics)
        numbers = scalars(metrics)
        for name, tracker in list(self.trackers):
            try:
                tracker.log(dict(numbers), step)
            except Exception as exc:  # noqa: BLE001 - any backend failure: drop that tracker
                log.warning(f"tracker {name!r} failed to log step {step} and is dropped for "
                            f"the rest of the run ({type(exc).__name__}: {exc}); metrics.jsonl "
                            "has every step")
                self.trackers.remove((name, tracker))
                _close_quietly(name, tracker, "failed")

    def write_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Rendered rollout samples: one run-log line each, and to every tracker that takes
        text (``log_samples``); a tracker failing here is warned about, not dropped."""
        for sample in samples:
            log.info(f"rollout sample (step {step}, reward {sample['reward']:g}): prompt "
                     f"{sample['prompt']!r} completion {sample['completion']!r}")
        for name, tracker in self.trackers:
            write = getattr(tracker, "log_samples", None)
            if write is None:
                continue
            try:
                write([dict(s) for s in samples], step)
            except Exception as exc:  # noqa: BLE001 - samples are a convenience
                log.warning(f"tracker {name!r} failed to log rollout samples at step {step} "
                            f"({type(exc).__name__}: {exc})")

    def close(self, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        for name, tracker in self.trackers:
            _close_quietly(name, tracker, status)


def _close_quietly(name: str, tracker: Any, status: str) -> None:
    try:
        tracker.close(status)
    except Exception as exc:  # noqa: BLE001 - closing one must not keep the others open
        log.warning(f"tracker {name!r} failed to close ({type(exc).__name__}: {exc})")


def open_report(metrics_log: Any, trackers: Sequence[Any], *, config: dict[str, Any],
                output_dir: Path, resume_step: int | None) -> RunReport:
    """Start each planned tracker (``plan.trackers``: name + built instance) on this run."""
    report = RunReport(metrics_log)
    for component in trackers:
        tracker = component.target(**component.options)
        run = TrackedRun(tracker=component.name, config=config, output_dir=output_dir,
                         resume_step=resume_step)
        try:
            tracker.start(run)
        except Exception as exc:
            report.close("failed")
            raise TrackerError(f"trainer.report_to: tracker {component.name!r} could not start "
                               f"({type(exc).__name__}: {exc})") from exc
        report.trackers.append((component.name, tracker))
    return report
