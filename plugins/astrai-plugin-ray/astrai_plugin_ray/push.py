"""Weight pushes from the trainer to every rollout worker, in size-bounded buckets.

* **collective**: a torch.distributed group of the trainer (rank 0) and the workers,
  formed once through a TCPStore the trainer hosts and kept apart from any default group
  the trainer itself uses (FSDP). Each bucket is one broadcast. The group is the device
  backend's own (NCCL, HCCL; ``DeviceBackend.process_group``) when the trainer and every
  worker are on devices of one family, else gloo with the buckets staged on CPU. The
  store listens on one address alone: 127.0.0.1 when every worker is on the trainer's
  Ray node (the collective library then keeps to the loopback interface too), else this
  node's address in the cluster, where the workers reach it.
* **object_store**: each bucket is put once in Ray's object store and every worker
  fetches it: for clusters where the workers cannot reach the trainer's address (a Ray
  Client connection) or a group cannot be formed.

A push logs ``rollout/weight_push_seconds`` (the slowest worker's transfer),
``rollout/weight_push_wait_seconds`` (the trainer's whole wait, including a generation
the workers were finishing) and ``rollout/weight_push_mb`` (the bytes sent); a delta push
(``push: delta``, :mod:`astrai_core.distributed.weight_delta`) also
``rollout/weight_push_full_mb``, what a full push would have sent.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch

from astrai_core.api import (LOOPBACK, DeltaEncoder, DeviceBackend, WeightPushMismatch,
                             bound_store, get_logger, loopback_collectives, process_registry,
                             resolve_device)
from astrai_plugin_ray.buckets import pack, plan_buckets
from astrai_plugin_ray.workers import WorkerSet

log = get_logger("astrai.ray")
FORM_TIMEOUT_S = 60.0  # `auto` gives up forming a group after this and uses the object store


class WeightPusher:
    """Pushes tensors to ``workers`` by ``mode`` (collective, object_store or auto);
    ``delta``: only what changed since the last push (every worker takes every push, so
    one :class:`DeltaEncoder` serves them all)."""

    def __init__(self, workers: WorkerSet, trainer_backend: DeviceBackend, mode: str,
                 bucket_bytes: int, timeout_s: float, client: bool, delta: bool = False) -> None:
        self.workers = workers
        self.encoder = DeltaEncoder() if delta else None
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.group: Any = None
        self.group_device = torch.device("cpu")
        self.transport = "object_store"
        if mode == "collective" or (mode == "auto" and not client):
            try:
                self._form_group(trainer_backend, timeout_s if mode == "collective"
                                 else min(timeout_s, FORM_TIMEOUT_S))
            except Exception as exc:
                if mode == "collective":
                    raise
                log.warning("no weight-push group could be formed; pushing through Ray's "
                            "object store", error=str(exc).splitlines()[0])
        log.info("weight pushes", transport=self.transport, workers=len(workers),
                 bucket_mb=bucket_bytes / 2**20, delta=delta)

    def _form_group(self, trainer: DeviceBackend, timeout_s: float) -> None:
        import ray
        import torch.distributed as dist

        worker_backends = {info["dist_backend"] for info in self.workers.info}
        on_device = trainer.type != "cpu" and worker_backends == {trainer.dist_backend}
        backend = trainer if on_device else resolve_device(process_registry(), "cpu")
        world = len(self.workers) + 1
        local = self._workers_are_local()
        host = LOOPBACK if local else ray.util.get_node_ip_address()
        timeout = timedelta(seconds=timeout_s)
        store = bound_store(host, world, timeout)
        prefix = f"astrai-weights-{uuid.uuid4().hex}"
        refs = [actor.join_group.remote(host, store.port, prefix, rank + 1, world, on_device,
                                        timeout_s, local)
                for rank, actor in enumerate(self.workers.actors)]
        with loopback_collectives(backend) if local else contextlib.nullcontext():
            self.group = backend.process_group(dist.PrefixStore(prefix, store), 0, world,
                                               timeout)
        self.workers.get(refs, "joining the weight-push group", timeout=timeout_s)
        self._store = store  # the group's rendezvous lives as long as the group
        self.group_device = trainer.device(0) if on_device else torch.device("cpu")
        self.transport = f"collective ({backend.dist_backend})"

    def _workers_are_local(self) -> bool:
        """Whether every worker runs on this process's Ray node (a local Ray, or workers
        placed on the trainer's node): the group then keeps to 127.0.0.1."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return all(info["node_id"] == node for info in self.workers.info)

    def push(self, groups: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
        """Send every group of tensors (names of the workers' policy; each group is a
        size-bounded bucket of full tensors, gathered while the previous one travels out
        of scope) to every worker, then tell the workers the push is whole; the metrics.
        With ``push: delta`` only what changed since the last push travels (one bucket
        per group, with its manifest); a push that fails makes the next one full."""
        start = time.perf_counter()
        calls: list[list[Any]] = [[] for _ in self.workers.actors]  # each worker's, in order
        pushed = full = 0
        try:
            if self.encoder is not None:
                self.encoder.start_push()
            for group in groups:
                full += sum(t.numel() * t.element_size() for t in group.values())
                pushed += self._push_group(group, calls)
            for index, actor in enumerate(self.workers.actors):
                calls[index].append(actor.finish_push.remote())
            seconds = [sum(self.workers.get_one(ref, index, "a weight push", self.timeout_s)
                           for ref in refs) for index, refs in enumerate(calls)]
        except BaseException as exc:
            if self.encoder is not None:
                self.encoder.reset()  # the workers may hold part of this push
            mismatch = getattr(exc, "cause", None)
            if isinstance(mismatch, WeightPushMismatch):  # one line, not Ray's traceback
                raise WeightPushMismatch(str(mismatch)) from None
            raise
        metrics = {"rollout/weight_push_seconds": max(seconds),
                   "rollout/weight_push_wait_seconds": time.perf_counter() - start,
                   "rollout/weight_push_mb": pushed / 2**20}
        if self.encoder is not None:
            metrics["rollout/weight_push_full_mb"] = full / 2**20
        return metrics

    def _push_group(self, group: dict[str, torch.Tensor], calls: list[list[Any]]) -> int:
        """Send one group (whole, or its delta) to every worker; the bytes sent."""
        manifest = None
        if self.encoder is None:
            buckets = plan_buckets(group, self.bucket_bytes)
        else:
            group, manifest = self.encoder.encode(group)
            # one bucket: the payload is never larger than the group it came from
            buckets = plan_buckets(group, math.inf) if manifest.records else []
        for bucket in buckets:
            self._send(bucket, group, manifest, calls)
        return sum(bucket.nbytes for bucket in buckets)

    def _send(self, bucket: Any, tensors: dict[str, torch.Tensor], manifest: Any,
              calls: list[list[Any]]) -> None:
        import ray

        actors = self.workers.actors
        if self.group is None:
            stored = [ray.put(pack(bucket, tensors, torch.device("cpu")))]
            refs = [actor.receive_bucket.remote(bucket, stored, manifest) for actor in actors]
        else:
            refs = [actor.receive_bucket.remote(bucket, None, manifest) for actor in actors]
            self._broadcast(bucket, tensors, refs)
        for index, ref in enumerate(refs):
            calls[index].append(ref)

    def _broadcast(self, bucket: Any, tensors: dict[str, torch.Tensor], refs: list[Any]) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        buffer = pack(bucket, tensors, self.group_device)
        try:
            self.group.broadcast([buffer], options).wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:  # a peer died (gloo sees it at once) or timed out
            self.group = None
            raise self.workers.first_death(refs, "a weight push", exc) from None

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.reset()  # its copy of the last push
        self.group = None
        self._store = None

