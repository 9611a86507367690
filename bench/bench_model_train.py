"""Training-step throughput: native astrai model vs transformers, same config and batch, CPU.

One step = forward + next-token cross-entropy + backward (no optimizer), the same for
both. The native model is imported from the transformers model, so the two hold the
same weights; iterations alternate between them so machine load hits both alike.

    .venv/bin/python bench/bench_model_train.py [--model-type llama] [--batch 4] [--seq 256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# ~26M parameters with the defaults below.
SIZE = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)


def build_models(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.plugins import load_plugins

    extra = {"head_dim": 64} if model_type == "qwen3" else {}
    config = AutoConfig.for_model(model_type, **SIZE, **extra)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                attn_implementation="sdpa")
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(f"{tmp}/hf")
        importer = load_importer(load_plugins(), model_type=model_type)
        importer.import_checkpoint(Path(tmp, "hf"), Path(tmp, "native"))
        native = load_pretrained(Path(tmp, "native"))
    return hf_model.train(), native.train()


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def step(model: torch.nn.Module, ids: torch.Tensor, native: bool) -> float:
    """Seconds for one forward + backward."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logits = model(ids)["logits"] if native else model(input_ids=ids).logits
    next_token_loss(logits, ids).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-type", default="llama", choices=("llama", "qwen3"))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust on a machine shared with other jobs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    hf_model, native = build_models(args.model_type)
    ids = torch.randint(0, SIZE["vocab_size"], (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(0))
    params = sum(p.numel() for p in native.parameters())
    print(f"{args.model_type}: {params / 1e6:.1f}M parameters, batch {args.batch} x seq {args.seq}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    times: dict[str, list[float]] = {"native": [], "transformers": []}
    for iteration in range(args.warmup + args.iters):
        for name, model in (("native", native), ("transformers", hf_model)):
            seconds = step(model, ids, native=name == "native")
            if iteration >= args.warmup:
                times[name].append(seconds)
    tokens = args.batch * args.seq
    rates = {name: tokens / statistics.median(values) for name, values in times.items()}
    for name, rate in rates.items():
        print(f"{name:>12}: {rate:9.0f} tokens/s (median of {args.iters} steps)")
    print(f"native/transformers: {rates['native'] / rates['transformers']:.3f}")


if __name__ == "__main__":
    main()
