"""One worker thread runs every engine call, taking tenants' queued jobs in turn.

Each tenant (a training model, a sampling session) has its own queue; the worker takes one
job from the next tenant with work, round robin, so one tenant's long backlog delays another
tenant's request by at most one job per tenant ahead of it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

Job = Callable[[], None]
REMEMBERED = 4096  # request ids kept per model to answer a retried request with


class FairScheduler:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queues: dict[str, deque[Job]] = {}
        self._turns: deque[str] = deque()  # tenants with queued work, in serving order
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tinker-engine", daemon=True)
        self._thread.start()

    def submit(self, tenant: str, job: Job) -> None:
        with self._cond:
            queue = self._queues.setdefault(tenant, deque())
            if not queue:
                self._turns.append(tenant)
            queue.append(job)
            self._cond.notify()

    def _take(self) -> Job | None:
        with self._cond:
            while not self._turns and not self._closed:
                self._cond.wait()
            if not self._turns:
                return None
            tenant = self._turns.popleft()
            queue = self._queues[tenant]
            job = queue.popleft()
            if queue:
                self._turns.append(tenant)
            else:
                del self._queues[tenant]
            return job

    def _run(self) -> None:
        while (job := self._take()) is not None:
            try:
                job()
            except Exception:  # a job reports its own errors; this keeps the worker alive
                log.exception("tinker job failed")

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued jobs, then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)


class SeqGate:
    """Releases each model's requests in ``seq_id`` order and spots retried ones.

    The SDK numbers a training client's requests 1, 2, … and may send them out of order
    (chunks of one call in parallel); a request waits here until its predecessors arrived.
    Call under :attr:`lock` together with creating the request's future.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._held: dict[str, dict[int, Job | None]] = {}
        self._seen: dict[str, dict[int, str]] = {}  # per model: seq_id -> request id

    def open(self, model_id: str, next_seq: int) -> None:
        self._next[model_id] = next_seq
        self._held[model_id] = {}

    def seen(self, model_id: str, seq: int) -> str | None:
        return self._seen.get(model_id, {}).get(seq)

    def arrive(self, model_id: str, seq: int, request_id: str, job: Job | None) -> list[Job]:
        """Record request ``seq`` (``job`` None: refused, its turn passes); the jobs now due."""
        seen = self._seen.setdefault(model_id, {})
        seen[seq] = request_id
        if len(seen) > REMEMBERED:  # a retry follows its request closely; the oldest go
            del seen[next(iter(seen))]
        expected = self._next.get(model_id)
        if expected is None or seq < expected:  # unordered, or a number already passed
            return [job] if job is not None else []
        held = self._held[model_id]
        held[seq] = job
        ready: list[Job] = []
        while expected in held:
            due = held.pop(expected)
            if due is not None:
                ready.append(due)
            expected += 1
        self._next[model_id] = expected
        return ready

    def close(self, model_id: str) -> None:
        self._next.pop(model_id, None)
        self._held.pop(model_id, None)
        self._seen.pop(model_id, None)
