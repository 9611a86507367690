"""One rank of the bucketed-gather check, run by tests/distributed/test_weight_gather.py
under ``python -m torch.distributed.run --nproc-per-node N`` (1 or 2). Every sharded
tensor is gathered in pieces of a few rows, as a large tensor is.

Each case holds sharded tensors (DTensors sharded on dim 0, unevenly where the size is
odd, e.g. an embedding of 55 rows on 2 ranks) beside their plain full copies in this
process. The rank gathers them in buckets and records whether the buckets' concatenation
equals the full copies bit for bit, and each bucket's size in bytes."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

import astrai_core.distributed.weight_gather as weight_gather
from astrai_core.distributed.context import DistContext
from astrai_core.distributed.fsdp import shard_module
from astrai_core.distributed.weight_gather import iter_full_buckets, iter_push_buckets
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.lora import inject_lora, merged_state_dict
from tests.distributed.worker_kit import run_worker, write_rank_result

CONFIG = dict(vocab_size=55, hidden_size=24, intermediate_size=40, num_layers=2,
              num_heads=3, num_kv_heads=1, head_dim=8)
SHAPES = {"uneven": (55, 8), "even": (6, 4), "one_row": (1, 5), "big": (300, 4),
          "bf16": (7, 3), "plain": (9,)}
BOUND = 1024  # bytes: "big" (4800 bytes) and "uneven" (1760) travel alone; others share
MODEL_BOUND = 6000  # bytes: a model's tensors share buckets (the largest: 5280)


def build(case: str) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**CONFIG, tie_word_embeddings=case == "tied"))
    if case == "lora":
        from peft import LoraConfig

        inject_lora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
        with torch.no_grad():  # B = 0 at init: move it so the adapter changes the merge
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
    return model


def compare(buckets: list[dict[str, torch.Tensor]], expected: dict[str, torch.Tensor]) -> dict:
    got = {name: t for bucket in buckets for name, t in bucket.items()}
    sizes = [sum(t.numel() * t.element_size() for t in b.values()) for b in buckets]
    return {"names": list(got) == list(expected),
            "equal": all(torch.equal(got[n], expected[n]) and got[n].dtype == expected[n].dtype
                         for n in expected if n in got),
            "sizes": sizes, "counts": [len(b) for b in buckets],
            "largest": max(t.numel() * t.element_size() for t in expected.values()),
            "plain": all(not hasattr(t, "full_tensor") for t in got.values())}


def tensors_case(mesh) -> dict:
    generator = torch.Generator().manual_seed(3)
    full = {name: torch.randn(shape, generator=generator,
                              dtype=torch.bfloat16 if name == "bf16" else torch.float32)
            for name, shape in SHAPES.items()}
    named = [(name, t if name == "plain" else distribute_tensor(t, mesh, [Shard(0)]))
             for name, t in full.items()]
    buckets = [dict(b) for b in iter_full_buckets(named, BOUND)]  # copies: a bucket is emptied
    return compare(buckets, full)


def model_case(case: str, ctx: DistContext) -> dict:
    reference = build(case)
    sharded = shard_module(copy.deepcopy(reference), ctx)
    expected = {n: t.detach() for n, t in merged_state_dict(reference).items()}
    buckets = [dict(b) for b in iter_push_buckets(sharded, MODEL_BOUND)]
    result = compare(buckets, expected)
    result["sharded"] = any(hasattr(p, "full_tensor") for p in sharded.parameters())
    if case == "lora":  # the merge changed the adapted weights (so equality tests the merge)
        base = reference.state_dict()
        result["merged_differs"] = not torch.equal(
            expected["layers.0.attn.q_proj.weight"], base["layers.0.attn.q_proj.base_layer.weight"])
    return result


def _edit_rows(tensor: torch.Tensor, first_row: int, step: int) -> None:
    """Change element 0 of every third row (by global row number): a sparse update."""
    for local in range(tensor.shape[0] if tensor.dim() else 0):
        if (first_row + local) % 3 == step % 3:
            tensor[local].view(-1)[0] += 1.0


def delta_case(ctx: DistContext) -> dict:
    """Delta pushes from a sharded bf16 model (rank 0 encodes what every rank gathers)
    into an unsharded receiver, against the same edits made on an unsharded copy."""
    from astrai_core.distributed.weight_delta import DeltaEncoder, apply_delta

    reference = build("untied").to(torch.bfloat16)
    sharded = shard_module(copy.deepcopy(reference), ctx)
    receiver = {n: t.clone() for n, t in reference.state_dict().items()}
    encoder, equal, sent, full = DeltaEncoder(), [], [], []
    for step in range(3):
        with torch.no_grad():
            for (name, param), ref in zip(sharded.named_parameters(), reference.parameters()):
                chunk = -(-ref.shape[0] // ctx.world_size) if ref.dim() else 0
                _edit_rows(param.to_local(), ctx.rank * chunk, step)
                _edit_rows(ref, 0, step)
        encoder.start_push()
        sent.append(0)
        full.append(0)
        for group in iter_push_buckets(sharded, MODEL_BOUND):
            full[-1] += sum(t.numel() * t.element_size() for t in group.values())
            payload, manifest = encoder.encode(group)
            sent[-1] += sum(t.numel() * t.element_size() for t in payload.values())
            apply_delta(receiver, {k: v.clone() for k, v in payload.items()}, manifest)
        equal.append(all(torch.equal(receiver[n].view(torch.int16), t.view(torch.int16))
                         for n, t in reference.state_dict().items()))
    return {"equal": equal, "sent": sent, "full": full}


def main(out_dir: Path) -> None:
    weight_gather.PIECE_BYTES = 40  # a gather in pieces of a row or a few (as big tensors are)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), mesh=mesh)
    results = {"tensors": tensors_case(mesh)}
    results.update({case: model_case(case, ctx) for case in ("untied", "tied", "lora")})
    results["delta"] = delta_case(ctx)
    write_rank_result(out_dir, ctx.rank, results)


if __name__ == "__main__":
    run_worker(main)
