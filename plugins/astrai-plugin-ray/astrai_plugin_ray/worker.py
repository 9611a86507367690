"""One rollout worker: a Ray actor holding its own copy of the policy and its own sampler.

The actor gets the policy module once (through Ray's object store, on CPU), moves it to
its device and builds the sampler the config names, found through this process's
registry. Weights then arrive as buckets (:mod:`astrai_plugin_ray.buckets`), one call
each, either by a broadcast over the trainer-and-workers group or from Ray's object
store, are copied into the worker's policy in place, and once the push is whole the
sampler is told that its policy changed (``update_weights(None)``, which a vLLM sampler
turns into an engine reload). Ray runs an
actor's calls one at a time in the order they were sent, so a generation requested
before a weight push always samples with the weights before it.

A worker whose sampler declares ``interruptible`` (its ``generate`` takes ``interrupt``,
as the torch sampler's does) also serves :meth:`RolloutWorker.interrupt` in a concurrency group
of its own, beside a running generation: a generation asked for as ``interruptible``
then ends after its current decode step and returns its unfinished completions as they
stand (``finish_reason="abort"``), so a weight push waiting behind it lands between two
decode steps. The interrupt holds until that push is whole.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from astrai_core.api import (Completion, DeltaManifest, SamplingParams, apply_delta,
                             hf_name_prefix, loopback_collectives, process_registry,
                             resolve_device, sampler_capabilities, state_digest)
from astrai_plugin_ray.buckets import Bucket, unpack


class RolloutWorker:
    """Built by Ray as ``ray.remote(RolloutWorker).options(...).remote(...)``."""

    def __init__(self, index: int, model: torch.nn.Module, tokenizer: Any, sampler_name: str,
                 sampler_options: dict[str, Any], device_name: str,
                 interruptible: bool = False) -> None:
        registry = process_registry()
        self.index = index
        self.backend = resolve_device(registry, device_name)
        self.device = self.backend.device(0)
        self.model = model.to(self.device).eval().requires_grad_(False)
        # Every name, tied ones included: a push may name either of two tied tensors.
        self._parameters = dict(self.model.named_parameters(remove_duplicate=False))
        self._parameters.update(self.model.named_buffers(remove_duplicate=False))
        prefix = hf_name_prefix(self.model)
        if prefix is not None:  # a transformers-backend policy: pushes carry the family's names
            self._parameters.update({name.removeprefix(prefix): tensor for name, tensor
                                     in list(self._parameters.items()) if name.startswith(prefix)})
        sampler_class = registry.load("sampler", sampler_name)
        self.sampler = sampler_class(model=self.model, tokenizer=tokenizer, **sampler_options)
        self.needs_close = sampler_capabilities(self.sampler).needs_close
        # whether generate passes `interrupt` on: the class's declaration, read once by the
        # WorkerSet that gave this actor its `control` concurrency group
        self.interruptible = interruptible
        self._interrupt = threading.Event()  # set by interrupt(), cleared by finish_push()
        self.group: Any = None
        self.group_device = torch.device("cpu")

    def describe(self) -> dict[str, Any]:
        """Where this worker runs (for error messages and the logs)."""
        import ray

        context = ray.get_runtime_context()
        return {"index": self.index, "node_id": context.get_node_id(),
                "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "device": str(self.device), "dist_backend": self.backend.dist_backend}

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams],
                 interruptible: bool = False,
                 images: Sequence[dict[str, Any] | None] | None = None) -> list[Completion]:
        """The sampler's completions; ``interruptible``: :meth:`interrupt` may end the call
        early (a sampler that cannot be interrupted runs it to the end); ``images``: each
        prompt's image inputs, given to a sampler that takes them (None: no images)."""
        extra: dict[str, Any] = {} if images is None else {"images": images}
        if interruptible and self.interruptible:
            extra["interrupt"] = self._interrupt
        return self.sampler.generate(prompts, params, **extra)

    def interrupt(self) -> None:
        """A weight push is on its way: an interruptible generation stops after its current
        decode step, and one that starts before the push is whole returns at once. Runs
        in the ``control`` concurrency group, beside a generation."""
        self._interrupt.set()

    # ---------------------------------------------------------------- weights
    def join_group(self, host: str, port: int, prefix: str, rank: int, world_size: int,
                   on_device: bool, timeout_s: float, loopback: bool = False) -> str:
        """Join the trainer's weight-push group; returns its backend's name. ``loopback``:
        every member is on this machine, so the collective library listens on loopback."""
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        store = dist.PrefixStore(prefix, dist.TCPStore(host, port, world_size=world_size,
                                                       is_master=False, timeout=timeout))
        backend = self.backend if on_device else resolve_device(process_registry(), "cpu")
        with loopback_collectives(backend) if loopback else contextlib.nullcontext():
            self.group = backend.process_group(store, rank, world_size, timeout)
        self.group_device = self.device if on_device else torch.device("cpu")
        return backend.dist_backend

    def receive_bucket(self, bucket: Bucket, refs: list[Any] | None = None,
                       manifest: DeltaManifest | None = None) -> float:
        """Take one bucket of new weights (broadcast from rank 0 of the weight-push group,
        or ``refs[0]`` from the object store) and copy it into the policy; returns the
        seconds it took here. The sampler is told once the push is whole (:meth:`finish_push`).
        With a ``manifest`` the bucket is a delta: applied, then every tensor it wrote is
        checked against the trainer's digest (``WeightPushMismatch`` names the tensor)."""
        import torch.distributed as dist

        start = time.perf_counter()
        if refs is None:
            buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.group_device)
            options = dist.BroadcastOptions()
            options.rootRank = 0
            self.group.broadcast([buffer], options).wait()
        else:
            import ray

            buffer = ray.get(refs[0])
        if manifest is None:
            self._copy_in(unpack(bucket, buffer))
        else:
            apply_delta(self._parameters, unpack(bucket, buffer), manifest,
                        where=f"rollout worker {self.index}")
        return time.perf_counter() - start

    def finish_push(self) -> float:
        """Every bucket of a push is in: tell the sampler its policy changed (a vLLM
        sampler reloads its engine); returns the seconds that took."""
        start = time.perf_counter()
        self.sampler.update_weights(None)
        self._interrupt.clear()  # generations from here on sample the new weights
        return time.perf_counter() - start

    def _copy_in(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in tensors.items():
                target = self._parameters.get(name)
                if target is None:
                    raise KeyError(f"rollout worker {self.index}: the policy has no tensor {name!r}")
                target.copy_(tensor)

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's state on CPU (tests compare it with the trainer's)."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def digests(self, names: list[str]) -> dict[str, str]:
        """The digest of each named tensor of the policy (``state_digest``), to compare with
        the trainer's; a name the policy lacks is missing from the answer."""
        return state_digest({name: self._parameters[name] for name in names
                             if name in self._parameters})

    def close(self) -> None:
        if self.needs_close:
            self.sampler.close()
        self.group = None
