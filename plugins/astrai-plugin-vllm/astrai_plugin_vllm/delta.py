"""``push: delta`` for the vllm sampler: only the values that changed since the last push
travel to the engine, which still reloads the whole model.

vLLM's layerwise reload needs every tensor of the model at each push (see
:mod:`astrai_plugin_vllm.weights`), so the engine side keeps a CPU copy of the last push
under Hugging Face names (a :class:`~astrai_core.api.DeltaMirror`), applies each delta
bucket to it, verifies every updated tensor's digest against the trainer's, and reloads
the engine from the copy. The trainer side encodes each bucket of full tensors (as
``iter_hf_push_buckets`` gathers them, bucket by bucket under FSDP) with a
:class:`~astrai_core.api.DeltaEncoder`: unchanged tensors stay home, tensors with few
changed elements travel as (flat indices, values). A delta crosses to an engine core in
its own process as safetensors bytes, its manifest as plain lists.

The first push, and the push after any failure, is whole. Memory: one CPU copy of the
pushed state on the trainer side (the encoder's) and one on the engine side (the
mirror), per engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from astrai_core.api import DeltaEncoder, WeightPushMismatch
from astrai_plugin_vllm import weights as weights_lib


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def to_wire(payload: dict[str, torch.Tensor], multiprocess: bool) -> Any:
    """The payload as the engine takes it: tensors in-process, safetensors bytes across."""
    return weights_lib.serialize(payload) if multiprocess else payload


class DeltaPusher:
    """The trainer side of ``push: delta`` for one engine (see the module docstring)."""

    def __init__(self, multiprocess: bool) -> None:
        self.encoder = DeltaEncoder()
        self.multiprocess = multiprocess
        self.fresh = True  # the next push is whole

    def reset(self) -> None:
        self.encoder.reset()
        self.fresh = True

    def push(self, engine: Any, buckets: Iterable[dict[str, torch.Tensor]],
             repack_moe: bool) -> tuple[int, int]:
        """Send what changed in ``buckets`` (HF names, full tensors) and reload the engine
        from its updated copy; (bytes sent, bytes a full push sends). A digest mismatch
        raises :class:`WeightPushMismatch` once every bucket was gathered (the ranks of a
        sharded trainer gather together); any failure makes the next push whole."""
        fresh, sent, full, mismatch = self.fresh, 0, 0, ""
        self.encoder.start_push()
        try:
            for bucket in buckets:
                full += nbytes(bucket)
                if mismatch:
                    continue  # this rank still takes part in the gathers
                payload, manifest = self.encoder.encode(bucket)
                if not manifest.records:
                    continue
                sent += nbytes(payload)
                answers = engine.collective_rpc("astrai_apply_delta", args=(
                    to_wire(payload, self.multiprocess), manifest.to_plain(), fresh))
                mismatch = next((answer for answer in answers if answer), "")
            if mismatch:
                raise WeightPushMismatch(mismatch)
            engine.collective_rpc("astrai_reload_from_mirror", args=(repack_moe,))
        except BaseException:
            self.reset()
            raise
        self.fresh = False
        return sent, full

    def verify(self, engine: Any, expected: dict[str, str]) -> None:
        """Compare the engine's copy of the last push with the trainer's digests; raises
        :class:`WeightPushMismatch` naming the first tensor that differs."""
        for digests in engine.collective_rpc("astrai_mirror_digests", args=(list(expected),)):
            wrong = [name for name, digest in expected.items() if digests.get(name) != digest]
            if wrong:
                raise WeightPushMismatch(
                    f"the vLLM engine holds other weights than the trainer: {len(wrong)} "
                    f"tensor(s) differ, first {wrong[0]!r}")
