"""Rollouts with one long prompt among short ones: the torch sampler's KV cache and time.

One generate call over ``--long`` (32,768) tokens of prompt and ``--shorts`` (15) prompts
of ``--short`` (256) tokens, greedy, ``--new-tokens`` (16) each, through a tiny native
model (``--layers`` 2, hidden ``--hidden`` 64, 4 query heads, 2 KV heads, float32), on
the CPU. Prints, as JSON:

- ``kv_positions_peak``: the most KV positions (rows x columns of one layer) that the
  caches alive at once held, after any forward; ``padded_positions``, what one batch
  left-padded to the longest prompt holds (rows x (longest + new tokens));
- ``kv_bytes_peak``: those positions' bytes over every layer's keys and values;
- ``rss_peak_mib``: the resident set's high-water mark above the resident set before
  the call (the prefill's activations and masks included);
- ``seconds``: the call's wall time.

    .venv/bin/python bench/bench_sampler_long_prompts.py [--long 32768] [--shorts 15]
        [--short 256] [--new-tokens 16] [--layers 2] [--hidden 64] [--prefill-chunk N]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import weakref
from pathlib import Path

import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.sampling import SamplingParams, TorchSampler

sys.path.insert(0, str(Path(__file__).parent))
from bench_lora_memory import rss_bytes  # noqa: E402


def tiny_model(layers: int, hidden: int, context: int) -> CausalLM:
    config = ModelConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_layers=layers, num_heads=4, num_kv_heads=2,
                         max_position_embeddings=context)
    torch.manual_seed(0)
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model.eval()


def cache_census(model: CausalLM) -> dict[str, int]:
    """Wrap ``model.forward`` to keep the peak positions and bytes of the live KV caches."""
    live: weakref.WeakSet = weakref.WeakSet()
    peak = {"positions": 0, "bytes": 0}
    forward = model.forward

    def counting(input_ids, *args, **kwargs):
        out = forward(input_ids, *args, **kwargs)
        if kwargs.get("kv_cache") is not None:
            live.add(kwargs["kv_cache"])
        caches = list(live)
        peak["positions"] = max(peak["positions"], sum(c.keys[0].shape[0] * c.keys[0].shape[2]
                                                       for c in caches))
        peak["bytes"] = max(peak["bytes"], sum(t.numel() * t.element_size() for c in caches
                                               for t in (*c.keys, *c.values)))
        return out
    model.forward = counting
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long", type=int, default=32768)
    parser.add_argument("--shorts", type=int, default=15)
    parser.add_argument("--short", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--prefill-chunk", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = tiny_model(args.layers, args.hidden, args.long + args.new_tokens)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (args.long,), generator=generator).tolist()]
    prompts += [torch.randint(1, 512, (args.short,), generator=generator).tolist()
                for _ in range(args.shorts)]
    options = {} if args.prefill_chunk is None else {"prefill_chunk": args.prefill_chunk}
    sampler = TorchSampler(model=model, **options)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    peak = cache_census(model)
    before = rss_bytes()
    start = time.perf_counter()
    sampler.generate(prompts, params)
    seconds = time.perf_counter() - start
    high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rows = len(prompts)
    print(json.dumps({
        "prompts": f"1 x {args.long} + {args.shorts} x {args.short}",
        "kv_positions_peak": peak["positions"],
        "padded_positions": rows * (args.long + args.new_tokens),
        "kv_bytes_peak": peak["bytes"],
        "rss_peak_mib": round(max(0, high_water - before) / 2**20, 1),
        "seconds": round(seconds, 2),
    }))


if __name__ == "__main__":
    main()
