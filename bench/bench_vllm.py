"""Rollout throughput of the ``vllm`` sampler vs the built-in ``torch`` sampler, and one weight push.

Same weights (a Qwen3-shaped model built with transformers and imported), same batch of
prompts of different lengths, same sampling (temperature 1, seeded, no stop token, so
every sequence produces ``--new-tokens`` tokens). Rounds alternate between the two
samplers so machine load hits both alike; the median round is reported. Then the time
of ``update_weights`` (the whole policy pushed into the running vLLM engine, prefix
cache reset) and of starting the engine. Runs on CUDA when available, else CPU, and says
which. Needs vLLM (``make venv-vllm``, then):

    .venv-vllm/bin/python bench/bench_vllm.py [--size tiny|small] [--batch 32] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

SIZES = {
    # The arithmetic example's scale: per-step overhead dominates.
    "tiny": dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32),
    # ~10M parameters: the matrix products start to count.
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32),
}


def build_native(size: str, root: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.plugins import load_plugins

    torch.manual_seed(0)
    config = Qwen3Config(max_position_embeddings=512, tie_word_embeddings=False, **SIZES[size])
    Qwen3ForCausalLM(config).float().save_pretrained(f"{root}/hf")
    load_importer(load_plugins(), model_type="qwen3").import_checkpoint(f"{root}/hf", f"{root}/native")
    return load_pretrained(f"{root}/native")


def make_prompts(batch: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 33, (batch,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pushes", type=int, default=5)
    args = parser.parse_args()

    from astrai_core.sampling import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler
    from astrai_plugin_vllm.sampler import VllmSampler

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as root:
        native = build_native(args.size, root).to(device)
    prompts = make_prompts(args.batch, SIZES[args.size]["vocab_size"])
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    options = dict(enforce_eager=device == "cpu", max_model_len=512, max_num_seqs=args.batch)
    if device == "cpu":
        options["cpu_kv_cache_gib"] = int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    startup, vllm_sampler = timed(lambda: VllmSampler(native, **options))
    torch_sampler = TorchSampler(native, max_batch_size=args.batch)
    for sampler in (torch_sampler, vllm_sampler):  # warm-up (lazy initialisation, caches)
        sampler.generate(prompts[:2], params.model_copy(update={"max_new_tokens": 4}))

    seconds: dict[str, list[float]] = {"torch": [], "vllm": []}
    tokens: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, sampler in (("torch", torch_sampler), ("vllm", vllm_sampler)):
            elapsed, completions = timed(lambda s=sampler: s.generate(prompts, params))
            seconds[name].append(elapsed)
            tokens[name] = sum(len(c.token_ids) for c in completions)

    state = {k: v.detach().clone() for k, v in native.state_dict().items()}
    pushes = [timed(lambda: vllm_sampler.update_weights(state))[0] for _ in range(args.pushes)]
    parameters = sum(p.numel() for p in native.parameters())
    rates = {name: tokens[name] / statistics.median(seconds[name]) for name in seconds}
    print(f"device: {device} ({torch.get_num_threads()} torch threads); model: {args.size} "
          f"qwen3, {parameters / 1e6:.2f}M parameters, float32; batch {args.batch} x "
          f"{args.new_tokens} new tokens, temperature 1")
    for name in ("torch", "vllm"):
        print(f"  {name:5s} sampler: {rates[name]:9.1f} tokens/s  (median of {args.rounds} rounds: "
              f"{statistics.median(seconds[name]):.3f} s for {tokens[name]} tokens)")
    print(f"  ratio vllm / torch: {rates['vllm'] / rates['torch']:.2f}x")
    print(f"  weight push (update_weights, whole model): median {statistics.median(pushes) * 1e3:.1f} ms "
          f"over {args.pushes} pushes")
    print(f"  vLLM engine start (export + vllm.LLM): {startup:.1f} s")
    vllm_sampler.close()


if __name__ == "__main__":
    main()
