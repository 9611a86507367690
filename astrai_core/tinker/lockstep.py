"""One engine over several processes: rank 0 serves, every rank runs each call in step.

The base is sharded over the processes (FSDP2), so a forward needs all of them. Rank 0's
:class:`LockstepEngine` hands each engine call to the other ranks (:class:`CallChannel`,
a broadcast of :mod:`~astrai_core.tinker.call_wire` bytes), runs it on its own
:class:`~astrai_core.tinker.engine.TorchEngine`, and the ranks then agree on whether it
succeeded everywhere (one all-reduce), so no rank waits on a peer that already gave up.
Every rank holds the same adapters and optimizer state and runs its share of a request's
datums (:mod:`~astrai_core.tinker.rank_rows`); rank 0's result, gathered from all of
them, is the answer. Only rank 0 writes files.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import torch

from astrai_core.distributed.context import DistContext
from astrai_core.log import get_logger
from astrai_core.tinker.call_wire import decode_call, encode_call
from astrai_core.tinker.engine import TorchEngine
from astrai_core.tinker.engine_types import (AdamSpec, BaseModelFacts, DatumIn,
                                             EngineRequestError, ForwardOut, LoraSpec,
                                             SampleOut, SamplerTarget, SampleSpec)

log = get_logger("astrai.tinker")
STOP = "stop"


class CallChannel:
    """Rank 0's messages to the other ranks, and the ranks' verdict on each call.

    ``idle_group``: the group a waiting rank receives the next message's length on; its
    timeout is long, since a server may sit idle for days (a rank that dies still ends
    the wait at once: its sockets close)."""

    def __init__(self, dist: DistContext, idle_group: Any) -> None:
        self.dist = dist
        self.idle_group = idle_group

    def send(self, message: bytes) -> None:
        length = torch.tensor([len(message)], dtype=torch.int64, device=self.dist.device)
        torch.distributed.broadcast(length, src=0, group=self.idle_group)
        data = torch.frombuffer(bytearray(message), dtype=torch.uint8).to(self.dist.device)
        torch.distributed.broadcast(data, src=0)

    def receive(self) -> bytes:
        length = torch.zeros(1, dtype=torch.int64, device=self.dist.device)
        torch.distributed.broadcast(length, src=0, group=self.idle_group)
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=self.dist.device)
        torch.distributed.broadcast(data, src=0)
        return data.cpu().numpy().tobytes()

    def failed_ranks(self, failed: bool) -> list[int]:
        """The ranks whose call failed (every rank's ``failed``, gathered by a sum)."""
        flags = torch.zeros(self.dist.world_size, dtype=torch.int64, device=self.dist.device)
        flags[self.dist.rank] = int(failed)
        torch.distributed.all_reduce(flags)
        return [rank for rank, flag in enumerate(flags.tolist()) if flag]


def run_call(engine: TorchEngine, method: str, kwargs: dict[str, Any]
             ) -> tuple[Any, Exception | None]:
    """(the result, None) of ``engine.method(**kwargs)``, or (None, what it raised)."""
    try:
        return getattr(engine, method)(**kwargs), None
    except Exception as error:  # handed back: the ranks agree on failures before raising
        return None, error


class LockstepEngine:
    """Rank 0's engine: each call runs on every rank; the Engine protocol to the server."""

    def __init__(self, engine: TorchEngine, channel: CallChannel) -> None:
        self.engine = engine
        self.channel = channel
        self.broken: str | None = None  # why the ranks can no longer run calls together
        self.stopped = False
        self.on_broken: Callable[[], None] = lambda: None
        self._lock = threading.Lock()

    def base_models(self) -> list[BaseModelFacts]:
        return self.engine.base_models()

    def model_base(self, model_id: str) -> BaseModelFacts:
        return self.engine.model_base(model_id)

    def create_model(self, model_id: str, base_model: str, lora: LoraSpec) -> None:
        return self._call("create_model", model_id=model_id, base_model=base_model, lora=lora)

    def unload_model(self, model_id: str) -> None:
        return self._call("unload_model", model_id=model_id)

    def forward(self, model_id: str, datums: list[DatumIn], loss_fn: str,
                loss_fn_config: dict[str, float] | None = None) -> ForwardOut:
        return self._call("forward", model_id=model_id, datums=datums, loss_fn=loss_fn,
                          loss_fn_config=loss_fn_config)

    def forward_backward(self, model_id: str, datums: list[DatumIn], loss_fn: str,
                         loss_fn_config: dict[str, float] | None = None) -> ForwardOut:
        return self._call("forward_backward", model_id=model_id, datums=datums,
                          loss_fn=loss_fn, loss_fn_config=loss_fn_config)

    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        return self._call("optim_step", model_id=model_id, adam=adam)

    def save_weights(self, model_id: str, name: str, *, for_sampler: bool) -> str:
        return self._call("save_weights", model_id=model_id, name=name, for_sampler=for_sampler)

    def load_weights(self, model_id: str, key: str, *, with_optimizer: bool) -> None:
        return self._call("load_weights", model_id=model_id, key=key,
                          with_optimizer=with_optimizer)

    def sample(self, target: SamplerTarget, prompt: list[int], num_samples: int,
               spec: SampleSpec, *, prompt_logprobs: bool = False) -> SampleOut:
        return self._call("sample", target=target, prompt=prompt, num_samples=num_samples,
                          spec=spec, prompt_logprobs=prompt_logprobs)

    def _call(self, method: str, **kwargs: Any) -> Any:
        with self._lock:
            if self.broken is not None or self.stopped:
                raise RuntimeError(f"the server is stopping: {self.broken or 'stopped'}")
            message = encode_call(method, kwargs)  # before any rank is involved
            self._together(lambda: self.channel.send(message), method)
            result, error = run_call(self.engine, method, kwargs)
            failed = self._together(lambda: self.channel.failed_ranks(error is not None), method)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"{method} failed on process {failed[0]} of the server "
                               "(its log has the error)")
        return result

    def _together(self, collective: Callable[[], Any], method: str) -> Any:
        """``collective()``; when it fails, the ranks have lost each other: the server stops."""
        try:
            return collective()
        except Exception as error:
            first = str(error).strip().split(". ")[0][:200]  # gloo's advice follows
            self.broken = (f"the server's processes lost each other during {method} "
                           f"({type(error).__name__}: {first})")
            self.on_broken()
            raise RuntimeError(self.broken) from None

    def stop(self) -> None:
        """Tell the other ranks to leave their loop (after the call in progress, if any);
        later calls are refused."""
        with self._lock:
            if self.broken is None and not self.stopped:
                try:
                    self._together(lambda: self.channel.send(encode_call(STOP, {})), STOP)
                except RuntimeError:
                    pass  # the ranks lost each other: ``broken`` says why
            self.stopped = True


def leave_stopping_to_rank_0() -> None:
    """On a rank > 0, from the moment it joined: a signal to stop (Ctrl-C, torchrun's
    SIGTERM) is left to rank 0, which ends this rank's loop after the call in progress
    (torchrun kills a rank that outlives its 30 s)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def serve_calls(engine: TorchEngine, channel: CallChannel) -> None:
    """A rank > 0's loop: run each call rank 0 hands over until it says stop; this rank
    never writes files."""
    engine.writes_files = False
    while True:
        method, kwargs = decode_call(channel.receive())
        if method == STOP:
            return
        _, error = run_call(engine, method, kwargs)
        if error is not None and not isinstance(error, EngineRequestError):
            log.error("engine call failed", method=method, rank=channel.dist.rank,
                      error=f"{type(error).__name__}: {error}")
        channel.failed_ranks(error is not None)
