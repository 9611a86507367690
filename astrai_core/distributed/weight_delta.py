"""Delta weight pushes: send only the values that changed since the last push, and check
what the receiver ends up holding.

An optimizer step at a small learning rate leaves most bf16 values of a policy
bit-identical (an update smaller than half a unit in the last place rounds away), so a
push that carries only the changed elements moves a fraction of the bytes of a full one.

* :class:`DeltaEncoder` (trainer side, one per receiver: a set of engines that all take
  every push) keeps a CPU copy of every tensor it last sent (one copy of the pushed
  state in host memory; exact element-wise comparison, where per-chunk hashes would
  resend whole chunks, since the changed values are scattered over every chunk). Each
  bucket of *full* tensors (as :func:`~astrai_core.distributed.weight_gather.iter_full_buckets`
  yields them, gathered under FSDP, so only the rank that pushes holds the copy) becomes
  a payload and a :class:`DeltaManifest`: an unchanged tensor is left out, a tensor with
  few changed elements travels as (int32/int64 flat indices, new values), the others
  whole. A tensor seen for the first time travels whole.
* Every tensor of the manifest carries the digest (BLAKE2b, 128 bits) of its new full
  value; :func:`apply_delta` (receiver side) writes the payload into the receiver's
  tensors and verifies each digest, raising :class:`WeightPushMismatch` naming the bucket
  and tensor: corruption in transit, or a receiver that did not hold the last push.
* :func:`state_digest` is the digest of every tensor of a state, to compare a receiver's
  whole state with the trainer's.
* :class:`DeltaMirror` (receiver side) is for a receiver that can only load whole states
  (an inference engine whose loader needs every tensor, every push): it keeps the last
  push's tensors on CPU, applies each delta bucket to them and hands the whole state on.
  A manifest crosses processes as plain lists and strings (:meth:`DeltaManifest.to_plain`).

Cost per push: the trainer compares and hashes every pushed tensor on CPU (gathered
device tensors are copied to host first) and the receiver hashes the tensors it updated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from astrai_core.errors import AstraiError

INDEX_SUFFIX = "#index"
VALUES_SUFFIX = "#values"
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class WeightPushMismatch(AstraiError):
    """A receiver's tensor does not hold what the trainer sent (digest mismatch)."""


@dataclass(frozen=True)
class DeltaRecord:
    """How one tensor travels in a delta bucket: ``dense`` (the payload's ``name``) or
    ``sparse`` (``name#index`` and ``name#values``); ``digest`` is its new full value's."""

    name: str
    mode: str
    digest: str


@dataclass(frozen=True)
class DeltaManifest:
    """What goes with one delta bucket's payload: its number in the push and its records."""

    bucket: int
    records: tuple[DeltaRecord, ...]

    def to_plain(self) -> list:
        """``[bucket, [[name, mode, digest], ...]]``: what any serializer carries."""
        return [self.bucket, [[r.name, r.mode, r.digest] for r in self.records]]

    @classmethod
    def from_plain(cls, plain: list | tuple) -> DeltaManifest:
        bucket, records = plain
        return cls(int(bucket), tuple(DeltaRecord(*record) for record in records))


def tensor_digest(tensor: torch.Tensor) -> str:
    """BLAKE2b (128-bit) of a tensor's raw bytes in row-major order (any dtype)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.blake2b(flat.numpy(), digest_size=16).hexdigest()  # no copy of the bytes


def state_digest(tensors: Mapping[str, torch.Tensor] | Iterable[Mapping[str, torch.Tensor]]
                 ) -> dict[str, str]:
    """``{name: tensor_digest}`` of a state, given as one mapping or as buckets of one."""
    buckets = [tensors] if isinstance(tensors, Mapping) else tensors
    return {name: tensor_digest(t) for bucket in buckets for name, t in bucket.items()}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width (bitwise comparison)."""
    return tensor.reshape(-1).view(_BITS[tensor.element_size()])


class DeltaEncoder:
    """Turns each bucket of full tensors into a delta against the last push (see the
    module docstring). ``reset()`` forgets it all: the next push is full."""

    def __init__(self) -> None:
        self._sent: dict[str, torch.Tensor] = {}
        self._buckets = 0

    def reset(self) -> None:
        self._sent.clear()
        self._buckets = 0

    def start_push(self) -> None:
        """A new push: its buckets are numbered from 0."""
        self._buckets = 0

    def encode(self, tensors: Mapping[str, torch.Tensor]
               ) -> tuple[dict[str, torch.Tensor], DeltaManifest]:
        """(payload tensors, manifest) of one bucket; the payload is never larger than the
        bucket itself. The copy of the last push is updated here."""
        payload: dict[str, torch.Tensor] = {}
        records: list[DeltaRecord] = []
        for name, tensor in tensors.items():
            new = tensor.detach().to("cpu").contiguous()
            old = self._sent.get(name)
            if old is not None and (old.shape != new.shape or old.dtype != new.dtype):
                old = None
            mode = "dense" if old is None else self._encode_changes(name, old, new, payload)
            if mode == "same":
                continue
            if mode == "dense":
                payload[name] = new
            records.append(DeltaRecord(name, mode, tensor_digest(new)))
            # a CPU tensor's `new` is the live tensor itself: keep a copy of it
            self._sent[name] = new.clone() if new.data_ptr() == tensor.data_ptr() else new
        manifest = DeltaManifest(self._buckets, tuple(records))
        self._buckets += 1
        return payload, manifest

    @staticmethod
    def _encode_changes(name: str, old: torch.Tensor, new: torch.Tensor,
                        payload: dict[str, torch.Tensor]) -> str:
        """"same", "dense", or "sparse" (index and values put in ``payload``)."""
        changed = (_bits(old) != _bits(new)).nonzero().reshape(-1)
        count = changed.numel()
        if count == 0:
            return "same"
        index_dtype = torch.int32 if new.numel() < 2**31 else torch.int64
        if count * (index_dtype.itemsize + new.element_size()) >= new.numel() * new.element_size():
            return "dense"
        payload[name + INDEX_SUFFIX] = changed.to(index_dtype)
        payload[name + VALUES_SUFFIX] = new.reshape(-1)[changed]
        return "sparse"


def apply_delta(targets: Mapping[str, torch.Tensor], payload: Mapping[str, torch.Tensor],
                manifest: DeltaManifest, where: str = "the receiver") -> list[str]:
    """Write one delta bucket into ``targets`` (the receiver's tensors, in place) and verify
    every written tensor's digest; returns the names written. Raises
    :class:`WeightPushMismatch` naming the bucket and tensor when one differs, KeyError
    when the receiver has no such tensor."""
    with torch.no_grad():
        for record in manifest.records:
            target = targets.get(record.name)
            if target is None:
                raise KeyError(f"{where}: the policy has no tensor {record.name!r}")
            if record.mode == "dense":
                target.copy_(payload[record.name])
            else:
                index = payload[record.name + INDEX_SUFFIX].to(target.device, torch.int64)
                values = payload[record.name + VALUES_SUFFIX].to(target.device)
                target.view(-1).index_copy_(0, index, values)
            if tensor_digest(target) != record.digest:
                raise WeightPushMismatch(
                    f"{where}: weight push bucket {manifest.bucket}, tensor {record.name!r} "
                    f"does not match the trainer's after the {record.mode} update (checksum "
                    "mismatch: corrupted in transit, or the receiver missed a push)")
    return [record.name for record in manifest.records]


class DeltaMirror:
    """A receiver's CPU copy of the last push, for receivers that reload whole states:
    :meth:`apply` writes each delta bucket into it (digests verified by
    :func:`apply_delta`); ``tensors`` is the whole pushed state. Any failure drops the
    copy, so only a whole push can start it again."""

    def __init__(self, where: str = "the receiver") -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.where = where

    def apply(self, payload: Mapping[str, torch.Tensor], manifest: DeltaManifest,
              fresh: bool) -> list[str]:
        """Apply one bucket; ``fresh``: the push is whole (the first one, or the one after
        a failure) and its bucket 0 starts a new copy. Returns the names written; raises
        :class:`WeightPushMismatch` on a digest mismatch, a tensor this copy lacks, or a
        delta arriving with no copy to apply it to."""
        if fresh and manifest.bucket == 0:
            self.tensors = {}
        try:
            if fresh:  # every tensor of a whole push travels whole: make room for it
                for record in manifest.records:
                    if record.mode != "dense":
                        raise WeightPushMismatch(f"{self.where}: tensor {record.name!r} came as "
                                                 "a delta in a whole push")
                    self.tensors.setdefault(record.name, torch.empty_like(
                        payload[record.name], device="cpu"))
            elif not self.tensors:
                raise WeightPushMismatch(f"{self.where} holds no copy of the last push to "
                                         "apply a delta to (it missed the whole push)")
            return apply_delta(self.tensors, payload, manifest, self.where)
        except KeyError as exc:  # apply_delta's own message, or a name the payload lacks
            self.tensors = {}
            message = str(exc.args[0])
            if not message.startswith(self.where):
                message = f"{self.where}: weight push bucket {manifest.bucket} lacks {message!r}"
            raise WeightPushMismatch(message) from None
        except BaseException:
            self.tensors = {}
            raise

    def digests(self, names: Iterable[str]) -> dict[str, str]:
        """The digest of each named tensor of the copy; a name it lacks is left out."""
        return state_digest({name: self.tensors[name] for name in names if name in self.tensors})
