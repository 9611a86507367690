"""Generation throughput: astrai's torch sampler vs transformers ``generate``, CPU.

Same weights (the native model is imported from the transformers model), same batch of
prompts of different lengths (left-padded for transformers), same number of new tokens
for every sequence (no stop token; transformers gets min_new_tokens = max_new_tokens).
Runs alternate between the two so machine load hits both alike. Prints generated
tokens/s of each and the ratio.

    .venv/bin/python bench/bench_sampler.py [--model-type qwen2] [--batch 16] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

# ~4M parameters: a small model, where per-step overhead matters as it does in RL on CPU.
SIZE = dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)


def build_models(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    from astrai_core.importers.select import load_importer
    from astrai_core.model import load_pretrained
    from astrai_core.plugins import load_plugins

    config = AutoConfig.for_model(model_type, **SIZE)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(f"{tmp}/hf")
        importer = load_importer(load_plugins(), model_type=model_type)
        importer.import_checkpoint(f"{tmp}/hf", f"{tmp}/native")
        native = load_pretrained(f"{tmp}/native")
    return hf_model.eval(), native.eval()


def make_prompts(batch: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 33, (batch,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def run_transformers(model, prompts, new_tokens: int, sample: bool) -> int:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    options = dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.9) if sample else dict(do_sample=False)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             eos_token_id=None, pad_token_id=0, **options)
    return (out.shape[1] - width) * len(prompts)


def run_astrai(sampler, prompts, new_tokens: int, sample: bool) -> int:
    from astrai_core.sampling import SamplingParams

    params = (SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_k=50, top_p=0.9, seed=0)
              if sample else SamplingParams(max_new_tokens=new_tokens, temperature=0.0))
    return sum(len(c.token_ids) for c in sampler.generate(prompts, params))


def measure(fn, repeats: int) -> tuple[float, int]:
    """Median seconds over ``repeats`` runs (after one warm-up) and tokens per run."""
    tokens = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-type", default="qwen2", choices=("llama", "qwen2", "mistral"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from astrai_core.sampling import TorchSampler

    hf_model, native = build_models(args.model_type)
    sampler = TorchSampler(model=native, max_batch_size=args.batch)
    prompts = make_prompts(args.batch, SIZE["vocab_size"])
    print(f"model {args.model_type} {sum(p.numel() for p in native.parameters()) / 1e6:.1f}M params, "
          f"batch {args.batch}, prompt lengths {min(map(len, prompts))}-{max(map(len, prompts))}, "
          f"{args.new_tokens} new tokens, {torch.get_num_threads()} threads, CPU")
    for mode, sample in (("greedy", False), ("sampling top-k 50, top-p 0.9", True)):
        rates = {}
        for name, fn in (("transformers generate", lambda: run_transformers(hf_model, prompts, args.new_tokens, sample)),
                         ("astrai torch sampler", lambda: run_astrai(sampler, prompts, args.new_tokens, sample))):
            seconds, tokens = measure(fn, args.repeats)
            rates[name] = tokens / seconds
            print(f"  {mode:30s} {name:22s} {tokens / seconds:9.0f} tokens/s ({tokens} tokens, {seconds:.3f} s)")
        ratio = rates["astrai torch sampler"] / rates["transformers generate"]
        print(f"  {mode:30s} ratio astrai / transformers: {ratio:.2f}x")


if __name__ == "__main__":
    main()
