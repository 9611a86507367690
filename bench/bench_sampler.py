"""Generation throughput: astrai's torch sampler vs transformers ``generate``, CPU.

Same weights (the native model is imported from the transformers model), same batch of
prompts of different lengths (left-padded for transformers), same number of new tokens
for every sequence (no stop token; transformers gets min_new_tokens = max_new_tokens).
Runs alternate between the two so machine load hits both alike. Prints generated
tokens/s of each and the ratio.

    .venv/bin/python bench/bench_sampler.py [--model-type qwen2] [--batch 16] [--new-tokens 64]
        [--device cpu|cuda|npu|auto] [--json figures.json]

On an accelerator both run in float32 there too, so that greedy outputs stay comparable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from astrai_core.rollout.batch import pad_rows

SIZE = dict(max_position_embeddings=1024)
SIZES = {
    # The arithmetic example's scale: per-step overhead dominates.
    "tiny": dict(vocab_size=64, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    # ~5M parameters: the matrix products dominate.
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4),
}


def build_models(model_type: str, device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM

    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.plugins import load_plugins

    config = AutoConfig.for_model(model_type, **SIZE)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(f"{tmp}/hf")
        importer = load_importer(load_plugins(), model_type=model_type)
        importer.import_checkpoint(f"{tmp}/hf", f"{tmp}/native")
        native = load_pretrained(f"{tmp}/native")
    return hf_model.to(device).eval(), native.to(device).eval()


def make_prompts(batch: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 33, (batch,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def run_transformers(model, prompts, new_tokens: int, sample: bool, eos: int | None = None) -> list[list[int]]:
    ids, mask = pad_rows(prompts, left=True, pad_value=0, dtype=torch.long)
    ids, mask = ids.to(model.device), mask.long().to(model.device)
    options = dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.9) if sample else dict(do_sample=False)
    if eos is None:  # every row runs the full length
        options["min_new_tokens"] = new_tokens
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=eos,
                             pad_token_id=0, **options)
    return [_until(row, eos) for row in out[:, ids.shape[1]:].tolist()]


def _until(tokens: list[int], eos: int | None) -> list[int]:
    """The generated tokens up to and including the first EOS (transformers pads after it)."""
    return tokens[:tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


def run_astrai(sampler, prompts, new_tokens: int, sample: bool, eos: int | None = None) -> list[list[int]]:
    from astrai_core.sampling import SamplingParams

    stops = (eos,) if eos is not None else ()
    params = (SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_k=50, top_p=0.9, seed=0)
              if sample else SamplingParams(max_new_tokens=new_tokens, temperature=0.0, stop_token_ids=stops))
    return [c.token_ids for c in sampler.generate(prompts, params)]


def pick_eos(greedy: list[list[int]]) -> int:
    """A token whose first appearance in the greedy outputs falls mid-way for the median row,
    so rows finish at different steps, as completions do in RL."""
    length = len(greedy[0])
    def median_stop(token: int) -> float:
        return statistics.median(row.index(token) if token in row else length for row in greedy)
    candidates = {t for row in greedy for t in row}
    return min(candidates, key=lambda t: abs(median_stop(t) - length / 2))


def measure(fns: dict, repeats: int) -> dict[str, tuple[float, list[list[int]]]]:
    """Fastest seconds of each over ``repeats`` alternating runs (after a warm-up), and its output.

    The minimum, not the mean: other processes on the machine only ever add time.
    """
    outputs = {name: fn() for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (min(times[name]), outputs[name]) for name in fns}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-type", default="qwen2", choices=("llama", "qwen2", "mistral"))
    parser.add_argument("--size", default="small", choices=tuple(SIZES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust on a machine shared with other jobs)")
    parser.add_argument("--device", default="cpu", help="device backend name (auto: the best)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)

    from astrai_core.devices.select import resolve_device
    from astrai_core.plugins import process_registry
    from astrai_core.sampling import TorchSampler

    device = resolve_device(process_registry(), args.device).device(0)
    SIZE.update(SIZES[args.size])
    hf_model, native = build_models(args.model_type, device)
    sampler = TorchSampler(model=native, max_batch_size=args.batch)
    prompts = make_prompts(args.batch, SIZE["vocab_size"])
    eos = pick_eos(run_astrai(sampler, prompts, args.new_tokens, sample=False))
    print(f"model {args.model_type} ({args.size}) {sum(p.numel() for p in native.parameters()) / 1e6:.2f}M "
          f"params, batch {args.batch}, prompt lengths {min(map(len, prompts))}-{max(map(len, prompts))}, "
          f"up to {args.new_tokens} new tokens, {torch.get_num_threads()} threads, {device}")
    scenarios = (("greedy, full length", False, None), ("sampling top-k/top-p, full length", True, None),
                 (f"greedy, stop at token {eos}", False, eos))
    figures = {"device": str(device), "scenarios": {}}
    for label, sample, stop in scenarios:
        results = measure({
            "transformers": lambda: run_transformers(hf_model, prompts, args.new_tokens, sample, stop),
            "astrai": lambda: run_astrai(sampler, prompts, args.new_tokens, sample, stop)}, args.repeats)
        figures["scenarios"][label] = report(label, results, sample)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


def report(label: str, results: dict[str, tuple[float, list[list[int]]]],
           sample: bool) -> dict[str, float | bool]:
    """Print one scenario's lines; its figures (tokens/s of each, the ratio)."""
    rates = {}
    for name, (seconds, outputs) in results.items():
        tokens = sum(map(len, outputs))
        rates[name] = tokens / seconds
        print(f"  {label:36s} {name:13s} {rates[name]:9.0f} tokens/s ({tokens} tokens in {seconds:.3f} s)")
    figures: dict[str, float | bool] = {f"{name}_tokens_per_second": rate for name, rate in rates.items()}
    if not sample:  # same weights, greedy: the same tokens (hence the same lengths)
        same = results["transformers"][1] == results["astrai"][1]
        print(f"  {label:36s} identical greedy outputs: {same}")
        figures["identical_greedy_outputs"] = same
    figures["ratio"] = rates["astrai"] / rates["transformers"]
    print(f"  {label:36s} ratio astrai / transformers: {figures['ratio']:.2f}x")
    return figures


if __name__ == "__main__":
    main()
