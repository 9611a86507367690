"""Any registry sampler (``--sampler vllm``) behind the engine interface, without continuous batching.

A worker thread takes every waiting request (up to ``max_batch_size``), generates them in
one ``sampler.generate`` call and then replays each completion's tokens through the same
:class:`~astrai_core.serving.sequence.Sequence` bookkeeping as the batching engine, so text,
stop strings and finish reasons are computed identically. The differences, by design:
tokens arrive when the whole batch is done (streaming then delivers them in one burst),
requests that arrive meanwhile wait for the next call, a cancelled request is dropped only
before its call starts, ``logit_bias`` and ``top_logprobs`` are refused (400), and copy
``c`` of a seeded request uses seed ``seed + c`` (the sampler has no per-copy streams).
vLLM schedules continuously inside its own engine; this adapter is the simple bridge.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import replace
from typing import Any

from astrai_core.log import get_logger
from astrai_core.serving.sequence import EngineRequest, EngineStats, Handle, Sequence, Sink

log = get_logger(__name__)


class SamplerEngine:
    supports_logit_bias = False
    supports_top_logprobs = False

    def __init__(self, sampler: Any, tokenizer: Any, *, max_context: int, vocab_size: int,
                 max_batch_size: int = 64) -> None:
        self.sampler, self.tokenizer = sampler, tokenizer
        self.max_context, self.vocab_size, self.max_batch_size = max_context, vocab_size, max_batch_size
        self._cond = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._running = 0
        self._stats = EngineStats(max_batch_size=max_batch_size)
        self._ids = itertools.count()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="astrai-sampler-engine", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest, sink: Sink) -> Handle:
        sequence = Sequence(request, Handle(next(self._ids)), sink, self.tokenizer)
        with self._cond:
            self._inbox.append(sequence)
            self._cond.notify_all()
        return sequence.handle

    def cancel(self, handle: Handle) -> None:
        handle.cancelled.set()

    def stats(self) -> EngineStats:
        with self._cond:
            return replace(self._stats, active=self._running, waiting=len(self._inbox))

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._inbox)
                if self._closing:
                    return
                batch = [self._inbox.popleft() for _ in range(min(len(self._inbox), self.max_batch_size))]
            live = [s for s in batch if not s.handle.cancelled.is_set()]
            for sequence in batch:
                if sequence.handle.cancelled.is_set():
                    self._stats.cancelled += 1
                    sequence.end("cancelled")
            if live:
                self._generate(live)

    def _generate(self, sequences: list[Sequence]) -> None:
        self._running = len(sequences)
        try:
            params = [self._sampler_params(s.request) for s in sequences]
            outs = self.sampler.generate([s.request.prompt_ids for s in sequences], params)
            for sequence, out in zip(sequences, outs, strict=True):
                logprobs = out.logprobs or [None] * len(out.token_ids)
                for token, logprob in zip(out.token_ids, logprobs, strict=True):
                    if sequence.record(token, logprob):
                        break
                if not sequence.done:  # the sampler stopped first (e.g. at its own stop token)
                    sequence.finish(out.finish_reason)
                self._stats.finished += 1
        except Exception as error:  # noqa: BLE001 - report to the clients, keep serving
            log.exception("sampler generate failed", error=str(error))
            for sequence in sequences:
                sequence.end("error", error=f"{type(error).__name__}: {error}")
        finally:
            self._running = 0

    @staticmethod
    def _sampler_params(request: EngineRequest):
        seed = request.params.seed
        # Stop strings are applied on replay (same holdback as the torch engine), so the
        # sampler runs to a stop token or max_new_tokens.
        return request.params.model_copy(update={"stop": (), "n": 1,
                                                 "seed": None if seed is None else seed + request.copy})
