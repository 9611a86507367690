"""The two model backends on the same Qwen3-shaped model: a training step and generation,
native (imported) against transformers, in one run.

Both backends hold the same weights (the native model is the import of the transformers
one) and go through the same code above the model: a step is the forward with
``target_ids`` (log-probs through the chunked head) and a backward; generation is the
torch sampler, greedy, with its KV cache (native: preallocated; transformers:
``DynamicCache``). Iterations alternate between the backends so that machine load hits
both alike; medians are reported.

    .venv/bin/python bench/bench_backends.py [--batch 4] [--seq 256] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

SIZE = dict(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=1024)


def build_models(directory: Path) -> dict[str, torch.nn.Module]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_core.checkpoints.model_source import describe, model_directory
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.plugins import load_plugins

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **SIZE),
                                          dtype=torch.float32)
    hf.save_pretrained(str(directory / "hf"))
    registry = load_plugins()
    source = describe(str(directory / "hf"), "native", registry)
    native = load_pretrained(model_directory(source, registry, directory / "cache"))
    return {"native": native, "transformers": load_transformers_model(directory / "hf")}


def train_step(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Seconds for one forward (log-probs of every next token) + backward."""
    from astrai_core.model.head import target_logprobs

    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logprobs = target_logprobs(model, ids, ids[:, 1:])["logprobs"]
    (-logprobs.mean()).backward()
    return time.perf_counter() - start


def generation(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for greedy generation of ``new_tokens`` per prompt (torch sampler)."""
    from astrai_core.sampling import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    start = time.perf_counter()
    TorchSampler(model=model).generate(prompts, params)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust on a machine shared with other jobs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SIZE["vocab_size"], (args.batch, args.seq), generator=generator)
    prompts = [torch.randint(0, SIZE["vocab_size"], (16,), generator=generator).tolist()
               for _ in range(args.prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(Path(tmp))
    params = sum(p.numel() for p in models["native"].parameters())
    print(f"qwen3-shaped: {params / 1e6:.1f}M parameters; step: batch {args.batch} x seq "
          f"{args.seq}; generation: {args.prompts} prompts x {args.new_tokens} new tokens; "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}")
    steps: dict[str, list[float]] = {name: [] for name in models}
    gens: dict[str, list[float]] = {name: [] for name in models}
    for iteration in range(args.warmup + args.iters):
        for name, model in models.items():
            model.train()
            seconds = train_step(model, ids)
            model.eval()
            gen_seconds = generation(model, prompts, args.new_tokens)
            if iteration >= args.warmup:
                steps[name].append(seconds)
                gens[name].append(gen_seconds)
    step_tokens, gen_tokens = args.batch * args.seq, args.prompts * args.new_tokens
    rates = {}
    for name in models:
        rates[name] = (step_tokens / statistics.median(steps[name]),
                       gen_tokens / statistics.median(gens[name]))
        print(f"{name:>12}: training step {rates[name][0]:8.0f} tok/s, "
              f"generation {rates[name][1]:7.0f} tok/s")
    print(f"native / transformers: training step {rates['native'][0] / rates['transformers'][0]:.2f}x, "
          f"generation {rates['native'][1] / rates['transformers'][1]:.2f}x")


if __name__ == "__main__":
    main()
