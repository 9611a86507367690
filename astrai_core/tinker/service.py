"""What the HTTP routes act on: sessions, training models, sampling sessions, queued jobs.

Every engine call becomes a job on the :class:`FairScheduler` under its tenant (the model,
or the sampling session), and its result lands in the :class:`FutureStore` the SDK polls.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from astrai_core.tinker.ckpt_index import CheckpointIndex
from astrai_core.tinker.engine_types import BaseModelFacts, Engine, EngineRequestError, LoraSpec
from astrai_core.tinker.futures import FutureStore, Payload, failure, json_payload
from astrai_core.tinker.scheduler import FairScheduler, SeqGate

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one client may ask of the server; more is a 4xx naming the limit."""

    max_adapters: int = 16
    max_body_bytes: int = 64 * MIB
    max_datums: int = 1024
    max_datum_tokens: int | None = None  # None: the base model's context length
    max_samples: int = 64


@dataclass
class ModelRecord:
    model_id: str
    session_id: str
    base: BaseModelFacts
    lora: LoraSpec
    create_request: str = ""


@dataclass
class SamplerRecord:
    sampler_id: str
    base_model: str
    key: str | None  # the sampler weights' state-dir key; None: the base model
    clients: int = 1


@dataclass
class SessionRecord:
    session_id: str
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False


class TinkerService:
    def __init__(self, engine: Engine, futures: FutureStore, limits: Limits,
                 index: CheckpointIndex | None = None) -> None:
        self.engine = engine
        self.index = index or CheckpointIndex(None)
        self.futures = futures
        self.limits = limits
        self.scheduler = FairScheduler()
        self.gate = SeqGate()
        self.bases = {b.name: b for b in engine.base_models()}
        self.sessions: dict[str, SessionRecord] = {}
        self.models: dict[str, ModelRecord] = {}
        self.samplers: dict[str, SamplerRecord] = {}
        self._lock = threading.Lock()

    # -- sessions -------------------------------------------------------------------------
    def new_session(self) -> str:
        session_id = uuid.uuid4().hex[:16]
        self.sessions[session_id] = SessionRecord(session_id)
        return session_id

    def session(self, session_id: str) -> SessionRecord:
        record = self.sessions.get(session_id)
        if record is None:
            raise EngineRequestError(f"unknown session {session_id!r}", status=404)
        if record.finished:
            raise EngineRequestError(f"session {session_id!r} has finished", status=410)
        record.last_seen = time.monotonic()
        return record

    def base(self, name: str | None) -> BaseModelFacts:
        if name not in self.bases:
            offered = ", ".join(sorted(self.bases)) or "none"
            raise EngineRequestError(f"unknown base model {name!r}; this server offers: {offered}")
        return self.bases[name]

    def model(self, model_id: str) -> ModelRecord:
        record = self.models.get(model_id)
        if record is None:
            raise EngineRequestError(f"unknown model_id {model_id!r}", status=404)
        return record

    # -- training models ------------------------------------------------------------------
    def create_model(self, session_id: str, model_seq_id: int, base: BaseModelFacts, lora: LoraSpec,
                     *, first_seq: int = 1) -> tuple[ModelRecord, str]:
        """Register ``{session}:train:{n}`` (limits checked) and queue its creation; the
        record and the creation's request id (the first one's, for a retried request).
        ``first_seq``: the ``seq_id`` of the model's first request after creation."""
        self.session(session_id)
        if not 1 <= lora.rank <= base.max_lora_rank:
            raise EngineRequestError(f"lora rank {lora.rank} is out of range: {base.name} takes "
                                     f"1 to {base.max_lora_rank}")
        model_id = f"{session_id}:train:{model_seq_id}"
        with self._lock:
            if model_id in self.models:
                record = self.models[model_id]
                return record, record.create_request
            if len(self.models) >= self.limits.max_adapters:
                raise EngineRequestError(f"this server holds at most {self.limits.max_adapters} "
                                         "adapters (--max-adapters); unload one first", status=429)
            record = self.models[model_id] = ModelRecord(model_id, session_id, base, lora)
            self.gate.open(model_id, first_seq)

        def work() -> Payload:
            try:
                self.engine.create_model(model_id, base.name, lora)
            except Exception:
                self.drop_model(model_id)
                raise
            return json_payload({"model_id": model_id, "type": "create_model"})
        record.create_request = self.enqueue(model_id, work)
        return record, record.create_request

    def drop_model(self, model_id: str) -> None:
        with self._lock:
            self.models.pop(model_id, None)
        self.gate.close(model_id)

    def unload(self, model_id: str) -> str:
        """Forget the model now and free its adapter in turn; the unload's request id."""
        self.drop_model(model_id)

        def work() -> Payload:
            self.engine.unload_model(model_id)
            return json_payload({"model_id": model_id, "type": "unload_model"})
        return self.enqueue(model_id, work)

    def finish_session(self, session_id: str) -> None:
        """Mark the session finished and unload its models (again: nothing more happens)."""
        record = self.sessions.get(session_id)
        if record is None:
            raise EngineRequestError(f"unknown session {session_id!r}", status=404)
        if record.finished:
            return
        record.finished = True
        for model_id in [m for m, rec in list(self.models.items()) if rec.session_id == session_id]:
            self.unload(model_id)

    def reap(self, max_idle_s: float) -> list[str]:
        """Finish the sessions not heard from (no heartbeat, no request) for ``max_idle_s``."""
        now = time.monotonic()
        stale = [s for s, rec in list(self.sessions.items())
                 if not rec.finished and now - rec.last_seen > max_idle_s]
        for session_id in stale:
            self.finish_session(session_id)
        return stale

    # -- sampling sessions ----------------------------------------------------------------
    def new_sampler(self, base_model: str, key: str | None) -> str:
        sampler_id = f"sampler-{uuid.uuid4().hex[:16]}"
        self.samplers[sampler_id] = SamplerRecord(sampler_id, base_model, key)
        return sampler_id

    def sampler(self, sampler_id: str) -> SamplerRecord:
        record = self.samplers.get(sampler_id)
        if record is None:
            raise EngineRequestError(f"unknown sampling session {sampler_id!r}", status=404)
        return record

    # -- queued work ----------------------------------------------------------------------
    def enqueue(self, tenant: str, work: Callable[[], Payload], *, model_seq: tuple[str, int] | None = None,
                feed: tuple[str, int] | None = None) -> str:
        """Queue ``work`` for ``tenant``; its request id (an earlier one for a retried request).

        ``model_seq``: the model's ``seq_id`` ordering applies; ``feed``: a sampling
        session's completion feed announces the result.
        """
        with self.gate.lock:
            if model_seq is not None and (earlier := self.gate.seen(*model_seq)) is not None:
                return earlier
            request_id = self.futures.create(feed)
            job = self._job(request_id, work)
            ready = self.gate.arrive(*model_seq, request_id, job) if model_seq else [job]
        for due in ready:
            self.scheduler.submit(tenant, due)
        return request_id

    def pass_turn(self, model_id: str, seq_id: int) -> None:
        """A refused request still uses its ``seq_id``, so the model's later ones may run."""
        with self.gate.lock:
            if self.gate.seen(model_id, seq_id) is None:
                for due in self.gate.arrive(model_id, seq_id, "refused", None):
                    self.scheduler.submit(model_id, due)

    def _job(self, request_id: str, work: Callable[[], Payload]) -> Callable[[], None]:
        def run() -> None:
            try:
                payload = work()
            except EngineRequestError as exc:
                payload = failure(str(exc))
            except Exception as exc:  # the engine's own failure: reported, the server lives on
                payload = failure(f"{type(exc).__name__}: {exc}", category="server")
            self.futures.resolve(request_id, payload)
        return run

    def close(self) -> None:
        self.scheduler.close()
