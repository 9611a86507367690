"""Any registry sampler (``--sampler vllm``) behind the engine interface, without continuous batching.

A worker thread takes every waiting request (up to ``max_batch_size``), generates them in
one ``sampler.generate`` call and then replays each completion's tokens through the same
:class:`~astrai_core.serving.sequence.Sequence` bookkeeping as the batching engine, so text,
stop strings and finish reasons are computed identically. The differences, by design:
tokens arrive when the whole batch is done (streaming then delivers them in one burst),
requests that arrive meanwhile wait for the next call, a cancelled request is dropped only
before its call starts, ``logit_bias`` and ``top_logprobs`` are refused (400), and copy
``c`` of a seeded request uses seed ``seed + c`` (the sampler has no per-copy streams).
A prompt with images (a vision-language model) passes its processor's image inputs to a
sampler whose ``generate`` takes ``images`` (the torch sampler); the batch's other prompts
pass none.
vLLM schedules continuously inside its own engine; this adapter is the simple bridge.
"""

from __future__ import annotations

from typing import Any

from astrai_core.plugins.sampler_capabilities import sampler_capabilities
from astrai_core.serving.engine_base import ThreadedEngine
from astrai_core.serving.sequence import EngineRequest, Sequence


class SamplerEngine(ThreadedEngine):
    """``SamplerEngine(sampler, tokenizer, max_context=..., vocab_size=...)``; see the module docstring."""

    supports_logit_bias = False
    supports_top_logprobs = False
    thread_name = "astrai-sampler-engine"

    def __init__(self, sampler: Any, tokenizer: Any, *, max_context: int, vocab_size: int,
                 max_batch_size: int = 64, max_queued: int | None = None) -> None:
        self.sampler, self.max_context, self.vocab_size = sampler, max_context, vocab_size
        self._running: list[Sequence] = []
        self.supports_images = sampler_capabilities(sampler).images
        super().__init__(tokenizer, max_batch_size, max_queued)

    def _active(self) -> list[Sequence]:
        return list(self._running)

    def _clear(self) -> None:
        self._running = []

    def _step(self) -> None:
        sequences = self._take(self.max_batch_size)
        if not sequences:
            return
        self._running = sequences
        params = [self._sampler_params(s.request) for s in sequences]
        images = [s.request.images for s in sequences]
        extra = {"images": images} if any(i is not None for i in images) else {}
        outs = self.sampler.generate([s.request.prompt_ids for s in sequences], params, **extra)
        for sequence, out in zip(sequences, outs, strict=True):
            logprobs = out.logprobs or [None] * len(out.token_ids)
            for token, logprob in zip(out.token_ids, logprobs, strict=True):
                if sequence.record(token, logprob):
                    break
            if not sequence.done:  # the sampler stopped first (e.g. at its own stop token)
                sequence.finish(out.finish_reason)
            self._stats.finished += 1
        self._running = []

    @staticmethod
    def _sampler_params(request: EngineRequest):
        seed = request.params.seed
        # Stop strings are applied on replay (same holdback as the torch engine), so the
        # sampler runs to a stop token or max_new_tokens.
        return request.params.model_copy(update={"stop": (), "n": 1,
                                                 "seed": None if seed is None else seed + request.copy})
