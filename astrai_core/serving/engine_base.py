"""The thread, inbox and counters both engines share; subclasses say what one step does."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import replace
from typing import Any

from astrai_core.log import get_logger
from astrai_core.serving.sequence import EngineRequest, EngineStats, Handle, Sequence, Sink

log = get_logger(__name__)


class ThreadedEngine:
    """Requests go to an inbox; a background thread calls :meth:`_step` while there is work.

    Subclasses set their own attributes, then call ``super().__init__`` (which starts the
    thread), and implement ``_step`` (one unit of work), ``_active`` (sequences being
    generated) and optionally ``_busy`` (work left besides the inbox).
    """

    thread_name = "astrai-engine"

    def __init__(self, tokenizer: Any, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self._cond = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._stats = EngineStats(max_batch_size=max_batch_size)
        self._ids = itertools.count()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public (any thread)
    def submit(self, request: EngineRequest, sink: Sink) -> Handle:
        sequence = Sequence(request, Handle(next(self._ids)), sink, self.tokenizer)
        with self._cond:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._inbox.append(sequence)
            self._cond.notify_all()
        return sequence.handle

    def cancel(self, handle: Handle) -> None:
        """Free the request's slot at the next step boundary."""
        with self._cond:
            if not handle.cancelled.is_set():
                handle.cancel_step = self._stats.decode_steps
                handle.cancelled.set()
            self._cond.notify_all()

    def stats(self) -> EngineStats:
        with self._cond:
            return self._stats_locked()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---------------------------------------------------------------- for subclasses
    def _active(self) -> list[Sequence]:
        raise NotImplementedError

    def _busy(self) -> bool:
        return False

    def _step(self) -> None:
        raise NotImplementedError

    def _stats_locked(self) -> EngineStats:
        return replace(self._stats, active=len(self._active()), waiting=len(self._inbox))

    def _take(self, limit: int) -> list[Sequence]:
        """Up to ``limit`` waiting sequences; cancelled ones met on the way are released."""
        taken: list[Sequence] = []
        with self._cond:
            while self._inbox and len(taken) < limit:
                sequence = self._inbox.popleft()
                if sequence.handle.cancelled.is_set():
                    self._release(sequence)
                else:
                    taken.append(sequence)
        return taken

    def _release(self, sequence: Sequence) -> None:
        """A cancelled sequence leaves: count it and say so to its consumer."""
        delay = self._stats.decode_steps - (sequence.handle.cancel_step or 0)
        self._stats.max_cancel_delay_steps = max(self._stats.max_cancel_delay_steps, delay)
        self._stats.cancelled += 1
        sequence.end("cancelled")

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._inbox or self._busy())
                if self._closing:
                    break
            try:
                self._step()
            except Exception as error:  # noqa: BLE001 - one bad step must not kill the server
                log.exception("engine step failed", error=str(error))
                self._fail_all(f"{type(error).__name__}: {error}")
            with self._cond:
                self._cond.notify_all()  # waiters on stats()
        self._fail_all("the server is shutting down", reason="cancelled")

    def _fail_all(self, message: str, reason: str = "error") -> None:
        with self._cond:
            waiting, self._inbox = list(self._inbox), deque()
        running = self._active()
        self._clear()
        for sequence in running + waiting:
            sequence.end(reason, error=message)
        with self._cond:
            self._cond.notify_all()

    def _clear(self) -> None:
        """Forget the running sequences (after a failure)."""
        raise NotImplementedError
