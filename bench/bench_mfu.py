"""MFU and tokens/s of a training step on a Qwen3-0.6B-shaped random native model.

One step = forward + next-token cross-entropy + backward + optimizer step, on random
tokens, bf16 compute with float32 master weights: FSDP2 (``fully_shard`` per decoder
layer and at the root, ``MixedPrecisionPolicy(bf16, reduce fp32)``) when launched with
several processes, bf16 autocast in one. MFU is model FLOPs per second over the peak of
the devices used; the model FLOPs of a token are PaLM's (appendix B)

    6 * (matmul parameters, the output head included) + 12 * layers * heads * head_dim * seq

so activation checkpointing's recompute is not counted as useful work. The peak is looked
up by device name (bf16 dense, no sparsity) or given with ``--peak-tflops``.

With ``--peer transformers`` (one process) the same shape is then built as
transformers' ``Qwen3ForCausalLM`` (random weights, sdpa attention) and trained with the
same optimizer, autocast, loss, batch and step count: its tokens/s and MFU are reported
beside astrai's, and the ratio.

    python bench/bench_mfu.py [--shape qwen3-0.6b|qwen3-4b] [--batch 8] [--seq 2048] [--optimizer adamw|muon]
    python bench/bench_mfu.py --peer transformers
    python -m torch.distributed.run --nproc-per-node 8 bench/bench_mfu.py ...
    python bench/bench_mfu.py --smoke          # a tiny model on CPU: the script still runs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# Qwen/Qwen3-0.6B's config.json (the architecture; the weights here are random).
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                  num_heads=16, num_kv_heads=8, head_dim=128, qk_norm=True, rope_theta=1e6,
                  tie_word_embeddings=True, max_position_embeddings=40960)
# Qwen/Qwen3-4B's config.json.
QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                num_heads=32, num_kv_heads=8, head_dim=128, qk_norm=True, rope_theta=1e6,
                tie_word_embeddings=True, max_position_embeddings=40960)
SHAPES = {"qwen3-0.6b": QWEN3_0_6B, "qwen3-4b": QWEN3_4B}
SMOKE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True,
             max_position_embeddings=128)
# Dense bf16 peak TFLOP/s per device (vendor datasheets, without sparsity), by the first
# name fragment found in the device name; order matters (H100 NVL/PCIe before H100).
PEAK_TFLOPS = [("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4),
               ("GH200", 989.4), ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.0),
               ("L4", 121.0)]


def peak_tflops(device_name: str) -> float | None:
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in device_name:
            return tflops
    return None


def flops_per_token(config: Any, seq: int) -> int:
    """Training FLOPs of one token (forward + backward): PaLM's 6N + 12 L H Q T."""
    hidden, layers = config.hidden_size, config.num_layers
    head_dim = config.head_dim or hidden // config.num_heads
    q, kv = config.num_heads * head_dim, config.num_kv_heads * head_dim
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * config.intermediate_size
    matmul = layers * per_layer + config.vocab_size * hidden  # the head, tied or not
    return 6 * matmul + 12 * layers * config.num_heads * head_dim * seq


def device_name(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    return torch.get_device_module(device.type).get_device_name(device)


class Setup:
    """The device backend, the process group (when launched by torchrun) and the mesh."""

    def __init__(self, device_name: str) -> None:
        from astrai_core.devices.select import resolve_device
        from astrai_core.plugins import process_registry

        self.backend = resolve_device(process_registry(), device_name)
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.backend.set_device(local_rank)
        self.device = self.backend.device(local_rank)
        self.mesh = None
        if self.world > 1:
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            dist.init_process_group(self.backend.dist_backend, device_id=(
                self.device if self.device.type != "cpu" else None))
            self.mesh = init_device_mesh(self.device.type, (self.world,))

    def close(self) -> None:
        if self.mesh is not None:
            import torch.distributed as dist

            dist.barrier()  # neither rank takes the group down while the other still uses it
            dist.destroy_process_group()


def build(setup: Setup, shape: dict[str, Any], checkpointing: bool) -> torch.nn.Module:
    from astrai_core.model import CausalLM, ModelConfig, enable_activation_checkpointing

    torch.manual_seed(0)
    with setup.device:
        model = CausalLM(ModelConfig(**shape)).train()
    enable_activation_checkpointing(model, checkpointing)
    if setup.mesh is not None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mesh=setup.mesh, mp_policy=policy)
        fully_shard(model, mesh=setup.mesh, mp_policy=policy)
    return model


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor,
               setup: Setup) -> torch.Tensor:
    # One process: autocast to bf16; under FSDP2 the mixed-precision policy casts instead.
    dtype = torch.bfloat16 if setup.mesh is None else None
    with setup.backend.autocast(dtype):
        logits = model(ids)
    logits = logits["logits"] if isinstance(logits, dict) else logits.logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def time_steps(model: torch.nn.Module, args: argparse.Namespace, setup: Setup,
               vocab: int) -> tuple[float, float]:
    """Seconds per training step of ``model`` (after ``args.warmup`` steps) and the last
    loss, on the same random tokens and with the same optimizer whatever the model."""
    from astrai_core.config.trainer import TrainerConfig
    from astrai_core.training.optim import build_optimizer

    trainer = TrainerConfig(max_steps=1, lr=1e-4, optimizer=args.optimizer, weight_decay=0.1)
    optimizer = build_optimizer(list(model.named_parameters()), trainer)
    generator = torch.Generator().manual_seed(1 + setup.rank)
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=generator).to(setup.device)
    for _ in range(args.warmup):
        train_step(model, optimizer, ids, setup)
    setup.backend.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(model, optimizer, ids, setup)
    setup.backend.synchronize()
    return (time.perf_counter() - start) / args.steps, float(loss)


def figures(flops: int, tokens: int, seconds: float, peak: float | None,
            world: int) -> dict[str, Any]:
    achieved = flops * tokens / seconds
    return {"step_seconds": seconds, "tokens_per_second": tokens / seconds,
            "achieved_tflops": achieved / 1e12,
            "mfu": None if peak is None else achieved / (peak * 1e12 * world)}


def build_transformers_peer(setup: Setup, shape: dict[str, Any],
                            checkpointing: bool) -> torch.nn.Module:
    """The same shape as transformers' Qwen3ForCausalLM (random weights, float32 master
    weights as astrai's, sdpa attention)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], tie_word_embeddings=shape["tie_word_embeddings"],
        max_position_embeddings=shape["max_position_embeddings"], attn_implementation="sdpa")
    torch.manual_seed(0)
    with setup.device:
        model = Qwen3ForCausalLM(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def measure_peer(args: argparse.Namespace, setup: Setup, shape: dict[str, Any],
                 flops: int, peak: float | None) -> dict[str, Any]:
    import transformers

    model = build_transformers_peer(setup, shape, args.activation_checkpointing)
    seconds, loss = time_steps(model, args, setup, shape["vocab_size"])
    parameters = sum(p.numel() for p in model.parameters())  # a tied head once
    del model
    return {"name": f"transformers {transformers.__version__} Qwen3ForCausalLM",
            "parameters": parameters, **figures(flops, args.batch * args.seq, seconds, peak, 1),
            "final_loss": loss}


def run(args: argparse.Namespace) -> dict[str, Any]:
    setup = Setup(args.device)
    shape = SMOKE if args.smoke else SHAPES[args.shape]
    if args.peer and setup.world > 1:
        raise SystemExit("--peer: one process only (the peer is not sharded)")
    model = build(setup, shape, args.activation_checkpointing)
    seconds, loss = time_steps(model, args, setup, shape["vocab_size"])
    config, parameters = model.config, model.num_parameters()
    memory = setup.backend.memory_stats()
    del model  # frees the device for the peer
    setup.backend.empty_cache()
    tokens = args.batch * args.seq * setup.world  # global tokens per step
    flops = flops_per_token(config, args.seq)
    name = device_name(setup.device)
    peak = args.peak_tflops or peak_tflops(name)
    result = {
        "device": name, "shape": "smoke" if args.smoke else args.shape,
        "world_size": setup.world, "parameters": parameters,
        "batch_per_rank": args.batch, "seq": args.seq, "optimizer": args.optimizer,
        "activation_checkpointing": args.activation_checkpointing,
        "flops_per_token": flops, **figures(flops, tokens, seconds, peak, setup.world),
        "peak_tflops_per_device": peak, "final_loss": loss, "memory": memory,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if args.peer:
        result["peer"] = measure_peer(args, setup, shape, flops, peak)
        result["time_ratio"] = seconds / result["peer"]["step_seconds"]
    setup.close()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="qwen3-0.6b",
                        help="the architecture measured (random weights)")
    parser.add_argument("--peer", choices=("transformers",), default=None,
                        help="also measure this implementation of the same shape")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--device", default="auto", help="device backend name")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="bf16 peak TFLOP/s per device (overrides the table)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model, seq 32, batch 2, 2 steps: checks the script runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.seq, args.steps, args.warmup = 2, 32, 2, 1
    result = run(args)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    mfu = "n/a (unknown peak: --peak-tflops)" if result["mfu"] is None else f"{result['mfu']:.1%}"
    print(f"{result['device']} x{result['world_size']}: {result['parameters'] / 1e6:.0f}M params, "
          f"{result['tokens_per_second']:,.0f} tokens/s, {result['achieved_tflops']:.1f} TFLOP/s, "
          f"MFU {mfu} (batch {args.batch} x seq {args.seq} per rank, {args.optimizer})")
    if "peer" in result:
        peer = result["peer"]
        peer_mfu = "n/a" if peer["mfu"] is None else f"{peer['mfu']:.1%}"
        print(f"{peer['name']}: {peer['tokens_per_second']:,.0f} tokens/s, MFU {peer_mfu}; "
              f"astrai's step takes {result['time_ratio']:.2f}x its time")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # torch 2.13's gloo may abort a process in the interpreter's teardown, after its
        # work is done: leave without it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
