"""Run a call on its own daemon thread and wait for it at most ``timeout`` seconds.

A daemon thread rather than a ``ThreadPoolExecutor``: Python cannot stop a thread, and an
executor's workers are joined at interpreter exit, so one tool that never returns would
hang the whole process at the end of the run. A timed-out call is abandoned (its thread
finishes, or not, on its own) and its result is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class CallTimeout(Exception):
    """The call did not return within its timeout."""


@dataclass
class PendingCall:
    """A call running on its own thread; :meth:`result` waits for it."""

    thread: threading.Thread
    finished: threading.Event
    outcome: list[Any]          # [value] or [None, exception] once finished

    def result(self, timeout: float | None) -> Any:
        """The call's value; raises its exception, or CallTimeout after ``timeout`` s."""
        if not self.finished.wait(timeout):
            raise CallTimeout(f"timed out after {timeout:g} s")
        if len(self.outcome) == 2:
            raise self.outcome[1]
        return self.outcome[0]


def start_call(function: Callable[..., Any], *args: Any, name: str = "astrai-env",
               **kwargs: Any) -> PendingCall:
    """Start ``function(*args, **kwargs)`` on a daemon thread."""
    finished = threading.Event()
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(function(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting caller
            outcome.extend([None, exc])
        finally:
            finished.set()

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return PendingCall(thread, finished, outcome)
