"""Weight push from an FSDP2-sharded trainer: time and rank-0 peak memory of the bucketed
gather (``iter_push_buckets``: full tensors built one size-bounded bucket at a time,
each dropped before the next) against gathering the whole state on rank 0 first
(``get_model_state_dict(full_state_dict=True, cpu_offload=True)``, what a checkpoint
does), on 2 processes (gloo, 1 thread each).

The model has Qwen3-0.6B's shapes (hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072,
vocabulary 151936, tied embedding, float32 master weights); ``--layers`` sets the depth
(Qwen3-0.6B has 28). The consumer of each bucket reads every tensor and drops it (a
stand-in for the engine's load or the broadcast to rollout workers). Peak memory is the
rise of rank 0's resident set above the shards it holds (Linux ``VmHWM`` after resetting
it through ``/proc/self/clear_refs``); each figure is the fastest time and the largest
peak of two runs after a warm-up. ``--lora`` also times a LoRA policy's merged push
(per adapted layer, from the gathered adapter) against an adapter-only push.

    .venv/bin/python bench/bench_weight_push.py [--layers 28] [--bucket-mb 512] [--lora]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPE = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_heads=16,
             num_kv_heads=8, head_dim=128, qk_norm=True, tie_word_embeddings=True)
MB = 2**20


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(run, repeats: int = 2) -> tuple[float, float]:
    """(fastest seconds, largest peak MB above the resident set at the start) of
    ``repeats`` runs of ``run()``, after one warm-up run (the collectives' first use)."""
    once(run)
    results = [once(run) for _ in range(repeats)]
    return min(r[0] for r in results), max(r[1] for r in results)


def once(run) -> tuple[float, float]:
    import torch.distributed as dist

    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = rss_kb("VmRSS")
    start = time.perf_counter()
    run()
    dist.barrier()
    return time.perf_counter() - start, (rss_kb("VmHWM") - before) / 1024


def consume(tensors) -> None:
    for tensor in tensors.values():
        float(tensor.reshape(-1)[-1])  # touch it, as a loader would read it


def build(layers: int, lora: bool, mesh):
    import torch

    from astrai_core.distributed.context import DistContext
    from astrai_core.distributed.fsdp import shard_module
    from astrai_core.model import CausalLM, ModelConfig

    import torch.distributed as dist

    with torch.device("meta"):
        model = CausalLM(ModelConfig(num_layers=layers, **SHAPE))
        if lora:
            from peft import LoraConfig

            from astrai_core.model.lora import inject_lora

            inject_lora(model, LoraConfig(r=16, lora_alpha=32, target_modules=[
                "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), mesh=mesh)
    shard_module(model, ctx)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().normal_(0, 0.02)  # each rank fills its own shard
    return model


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import init_device_mesh

    from astrai_core.checkpoints.sharded import full_model_state
    from astrai_core.distributed.context import DistContext
    from astrai_core.distributed.weight_gather import iter_full_buckets, iter_push_buckets

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ctx = DistContext(rank=rank, world_size=dist.get_world_size(), mesh=mesh)
    bucket = int(args.bucket_mb * MB)
    model = build(args.layers, False, mesh)
    state = model.state_dict()
    full_mb = sum(t.numel() * t.element_size() for t in state.values()) / MB
    largest_mb = max(t.numel() * t.element_size() for t in state.values()) / MB
    del state

    def bucketed() -> None:
        for group in iter_push_buckets(model, bucket):
            consume(group)

    def full_on_rank0() -> None:
        consume(full_model_state(model, ctx))  # {} on the other ranks

    results = {"layers": args.layers, "bucket_mb": args.bucket_mb, "full_state_mb": full_mb,
               "largest_tensor_mb": largest_mb, "shard_rss_mb": rss_kb("VmRSS") / 1024}
    for name, run in (("bucketed", bucketed), ("full_on_rank0", full_on_rank0)):
        seconds, peak = measure(run)
        results[name] = {"seconds": seconds, "peak_above_shard_mb": peak}
    del model
    if args.lora:
        lora = build(args.layers, True, mesh)

        def merged() -> None:
            for group in iter_push_buckets(lora, bucket):
                consume(group)

        def adapter_only() -> None:
            trained = ((n, p.detach()) for n, p in lora.named_parameters() if p.requires_grad)
            for group in iter_full_buckets(trained, bucket):
                consume(group)

        adapter_mb = sum(p.numel() * p.element_size() for p in lora.parameters()
                         if p.requires_grad) / MB
        results["lora"] = {"adapter_mb": adapter_mb}
        for name, run in (("merged", merged), ("adapter_only", adapter_only)):
            seconds, peak = measure(run)
            results["lora"][name] = {"seconds": seconds, "peak_above_shard_mb": peak}
    if rank == 0:
        Path(args.out).write_text(json.dumps(results, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--bucket-mb", type=float, default=512.0)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(args.out or f"/tmp/bench_weight_push_{os.getpid()}.json")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", __file__, "--worker", "--out", str(out),
               "--layers", str(args.layers), "--bucket-mb", str(args.bucket_mb)]
    if args.lora:
        command.append("--lora")
    # A fixed mmap threshold: glibc then returns every freed tensor to the OS at once, so
    # the resident set measures live tensors (its dynamic threshold would keep freed
    # megabyte tensors in the heap and hide a later peak).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(MB)}
    subprocess.run(command, check=True, env=env)
    results = json.loads(out.read_text())
    out.unlink()
    print(json.dumps(results, indent=2))
    bucketed, full = results["bucketed"], results["full_on_rank0"]
    bound = max(results["bucket_mb"], results["largest_tensor_mb"])
    print(f"bucketed push: {bucketed['seconds']:.2f} s, rank-0 peak above its shard "
          f"{bucketed['peak_above_shard_mb']:.0f} MB = "
          f"{bucketed['peak_above_shard_mb'] / results['bucket_mb']:.2f}x the bucket "
          f"({results['bucket_mb']:.0f} MB; largest tensor {results['largest_tensor_mb']:.0f} MB, "
          f"{bucketed['peak_above_shard_mb'] / bound:.2f}x the larger of the two)")
    print(f"full state on rank 0: {full['seconds']:.2f} s, peak above its shard "
          f"{full['peak_above_shard_mb']:.0f} MB (full state {results['full_state_mb']:.0f} MB)")


if __name__ == "__main__":
    main()
