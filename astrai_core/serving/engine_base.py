"""The thread, inbox and counters both engines share; subclasses say what one step does.

The inbox is fair: the sequences of one HTTP request form a group, and free batch slots
go to the waiting groups in turn (round-robin), so a small request queued behind a large
one starts as soon as one slot frees, not after the large one's last sequence. The inbox
is bounded (``max_queued``): a submission that would overflow it is refused whole with
:class:`QueueFull`, before anything of it is queued. A waiting sequence that is cancelled
leaves the inbox at once (its place is free for others, and it is never run).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import replace
from typing import Any

from astrai_core.log import get_logger
from astrai_core.serving.sequence import EngineRequest, EngineStats, Handle, Sequence, Sink

log = get_logger(__name__)


class QueueFull(Exception):
    """The inbox cannot take a submission: ``waiting`` sequences wait, at most ``limit``."""

    def __init__(self, wanted: int, waiting: int, limit: int) -> None:
        super().__init__(f"{wanted} more sequences do not fit: {waiting} are waiting, "
                         f"the queue holds at most {limit}")
        self.wanted, self.waiting, self.limit = wanted, waiting, limit


class ThreadedEngine:
    """Requests go to an inbox; a background thread calls :meth:`_step` while there is work.

    Subclasses set their own attributes, then call ``super().__init__`` (which starts the
    thread), and implement ``_step`` (one unit of work), ``_active`` (sequences being
    generated) and optionally ``_busy`` (work left besides the inbox).
    """

    thread_name = "astrai-engine"

    def __init__(self, tokenizer: Any, max_batch_size: int, max_queued: int | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_queued is not None and max_queued < 1:
            raise ValueError(f"max_queued must be >= 1, got {max_queued}")
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self._cond = threading.Condition()
        self._inbox: OrderedDict[int, deque[Sequence]] = OrderedDict()  # group -> its waiting sequences
        self._waiting = 0
        self._group_of: dict[int, int] = {}  # handle id -> its group, while the sequence waits
        self._stats = EngineStats(max_batch_size=max_batch_size)
        self._ids = itertools.count()
        self._groups = itertools.count()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public (any thread)
    def submit(self, request: EngineRequest, sink: Sink) -> Handle:
        return self.submit_group([request], [sink])[0]

    def submit_group(self, requests: Seq[EngineRequest], sinks: Seq[Sink]) -> list[Handle]:
        """Queue the sequences of one client request as one group (all or none: a group
        that would overflow ``max_queued`` raises :class:`QueueFull`)."""
        sequences = [Sequence(request, Handle(next(self._ids)), sink, self.tokenizer)
                     for request, sink in zip(requests, sinks, strict=True)]
        with self._cond:
            if self._closing:
                raise RuntimeError("the engine is closed")
            if self.max_queued is not None and self._waiting + len(sequences) > self.max_queued:
                raise QueueFull(len(sequences), self._waiting, self.max_queued)
            if sequences:
                group = next(self._groups)
                self._inbox[group] = deque(sequences)
                self._group_of.update((sequence.handle.id, group) for sequence in sequences)
                self._waiting += len(sequences)
            self._cond.notify_all()
        return [sequence.handle for sequence in sequences]

    def cancel(self, handle: Handle) -> None:
        """Free the request's slot at the next step boundary; a request still waiting
        leaves the inbox now."""
        with self._cond:
            if not handle.cancelled.is_set():
                handle.cancel_step = self._stats.decode_steps
                handle.cancelled.set()
            waiting = self._unqueue(handle)
            if waiting is not None:
                self._release(waiting)
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
        return replace(self._stats, active=len(self._active()), waiting=self._waiting)

    def _take(self, limit: int) -> list[Sequence]:
        """Up to ``limit`` waiting sequences, one group at a time in turn (round-robin);
        cancelled ones met on the way are released."""
        taken: list[Sequence] = []
        with self._cond:
            while self._inbox and len(taken) < limit:
                group, queue = next(iter(self._inbox.items()))
                sequence = queue.popleft()
                self._group_of.pop(sequence.handle.id, None)
                self._waiting -= 1
                if queue:
                    self._inbox.move_to_end(group)  # the next slot goes to the next group
                else:
                    del self._inbox[group]
                if sequence.handle.cancelled.is_set():
                    self._release(sequence)
                else:
                    taken.append(sequence)
        return taken

    def _unqueue(self, handle: Handle) -> Sequence | None:
        """Take ``handle``'s sequence out of the inbox (caller holds the lock); None when it
        is not waiting (running, finished, or already gone)."""
        group = self._group_of.pop(handle.id, None)
        queue = self._inbox.get(group) if group is not None else None
        sequence = next((s for s in queue if s.handle is handle), None) if queue else None
        if sequence is None:
            return None
        queue.remove(sequence)
        self._waiting -= 1
        if not queue:
            del self._inbox[group]
        return sequence

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
            waiting = [sequence for queue in self._inbox.values() for sequence in queue]
            self._inbox, self._waiting, self._group_of = OrderedDict(), 0, {}
        running = self._active()
        self._clear()
        for sequence in running + waiting:
            sequence.end(reason, error=message)
        with self._cond:
            self._cond.notify_all()

    def _clear(self) -> None:
        """Forget the running sequences (after a failure)."""
        raise NotImplementedError
