"""SIGINT and SIGTERM during training: finish the step, checkpoint, then stop.

The first signal only sets a flag; the trainer looks at it at each step boundary, where
the model, optimizers and batch source are consistent, saves a checkpoint there (unless
``trainer.checkpoint_on_signal`` is off) and raises :class:`TrainingInterrupted`, whose
exit code is the shell's 128 + signal number (130 for Ctrl-C, 143 for SIGTERM). A second
signal ends the process at once, by the signal's default action.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType

from astrai_core.distributed.worker_report import launched_worker
from astrai_core.errors import AstraiError
from astrai_core.log import get_logger

log = get_logger("astrai.trainer")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(AstraiError):
    """The run stopped on a signal, at a step boundary."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class StopOnSignal:
    """Within ``with``: the first SIGINT/SIGTERM is remembered in ``received``."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():  # signal() demands it
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # the second one: stop now
            self.__exit__(None, None, None)
            # By the signal's default action (the process ends; 130 or 143 for the shell),
            # not by an exception: library code would catch KeyboardInterrupt (DCP wraps
            # it into a CheckpointException) and end in a traceback, mid-save. Sent to
            # this very thread: os.kill could hand it to another thread while this one
            # went on. It leaves no room for an error message, so the one line goes first
            # (in a distributed run the launcher says it, once for every rank).
            if not launched_worker():
                print(f"error: stopped at once by a second {signal.Signals(signum).name}; a "
                      "checkpoint being written is left unfinished (the next run removes it)",
                      file=sys.stderr, flush=True)
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.received = signum
        log.warning(f"received {signal.Signals(signum).name}: stopping at the end of this "
                    "step (send it again to stop at once)")

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""
