"""Generation throughput: astrai's torch sampler vs transformers ``generate``, CPU.

Same weights (the native model is imported from the transformers model), same batch of
prompts of different lengths (left-padded for transformers), same number of new tokens
for every sequence (no stop token; transformers gets min_new_tokens = max_new_tokens).
Each runs in its own process, and their runs alternate one at a time (bench/lockstep.py),
so machine load hits both alike. Prints generated tokens/s of each (median run) and the
ratio (the median of the per-round ratios).

    .venv/bin/python bench/bench_sampler.py [--model-type qwen2] [--batch 16] [--new-tokens 64] [--repeats 5]
        [--device cpu|cuda|npu|auto] [--json figures.json]

On an accelerator both run in float32 there too, so that greedy outputs stay comparable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def build_models(model_type: str, device: torch.device, directory: str) -> torch.nn.Module:
    """A random transformers model saved to ``directory``/hf and imported to ``directory``/native;
    returns the native one (the peers load both from there)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.plugins import load_plugins

    config = AutoConfig.for_model(model_type, **SIZE)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    hf_model.save_pretrained(f"{directory}/hf")
    importer = load_importer(load_plugins(), model_type=model_type)
    importer.import_checkpoint(f"{directory}/hf", f"{directory}/native")
    return load_pretrained(f"{directory}/native").to(device).eval()


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


SCENARIOS = (("greedy, full length", False, False), ("sampling top-k/top-p, full length", True, False),
             ("greedy, stop at token {eos}", False, True))


def run_peer(args: argparse.Namespace) -> None:
    """One peer's process: each scenario's runs, every run timed and then gated (a warm-up
    run first, left out of the figures); the outputs of each scenario's warm-up written
    to ``--outputs``."""
    sys.path.insert(0, str(Path(__file__).parent))  # bench/lockstep.py
    from lockstep import StepGate

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    prompts = make_prompts(args.batch, SIZE["vocab_size"])
    if args.peer == "transformers":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(f"{args.model_dir}/hf", dtype=torch.float32,
                                                     attn_implementation="sdpa").to(device).eval()
        run = lambda sample, eos: run_transformers(model, prompts, args.new_tokens, sample, eos)  # noqa: E731
    else:
        from astrai_core.checkpoints.native import load_pretrained
        from astrai_core.sampling import TorchSampler

        sampler = TorchSampler(model=load_pretrained(f"{args.model_dir}/native").to(device).eval(),
                               max_batch_size=args.batch)
        run = lambda sample, eos: run_astrai(sampler, prompts, args.new_tokens, sample, eos)  # noqa: E731
    gate, outputs = StepGate(), []
    for _, sample, stops in SCENARIOS:
        eos = args.eos if stops else None
        for repeat in range(args.repeats + 1):
            start = time.perf_counter()
            tokens = run(sample, eos)
            seconds = time.perf_counter() - start
            if repeat == 0:
                outputs.append(tokens)
            gate.step_done(seconds)
    args.outputs.write_text(json.dumps(outputs))


def measure(args: argparse.Namespace, argv: list[str], model_dir: str, eos: int) -> list[dict]:
    """Both peers in their own processes, run by run in turn (bench/lockstep.py): per
    scenario, the seconds of each timed run of each and the warm-up's outputs."""
    sys.path.insert(0, str(Path(__file__).parent))
    from lockstep import interleave

    peers = ("transformers", "astrai")
    runs = args.repeats + 1
    with tempfile.TemporaryDirectory() as tmp:
        child = [sys.executable, __file__, *argv, "--model-dir", model_dir, "--eos", str(eos)]
        times = interleave({who: [*child, "--peer", who, "--outputs", f"{tmp}/{who}.json"]
                            for who in peers}, runs * len(SCENARIOS))
        outputs = {who: json.loads(Path(f"{tmp}/{who}.json").read_text()) for who in peers}
    return [{who: (times[who][index * runs + 1:(index + 1) * runs], outputs[who][index])
             for who in peers} for index in range(len(SCENARIOS))]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-type", default="qwen2", choices=("llama", "qwen2", "mistral"))
    parser.add_argument("--size", default="small", choices=tuple(SIZES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each scenario")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust on a machine shared with other jobs)")
    parser.add_argument("--device", default="cpu", help="device backend name (auto: the best)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    for hidden in ("--peer", "--model-dir", "--eos", "--outputs"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.eos = None if args.eos is None else int(args.eos)
    args.outputs = None if args.outputs is None else Path(args.outputs)
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    SIZE.update(SIZES[args.size])
    if args.peer is not None:
        return run_peer(args)

    from astrai_core.devices.select import resolve_device
    from astrai_core.plugins import process_registry
    from astrai_core.sampling import TorchSampler

    device = resolve_device(process_registry(), args.device).device(0)
    prompts = make_prompts(args.batch, SIZE["vocab_size"])
    with tempfile.TemporaryDirectory() as tmp:
        native = build_models(args.model_type, torch.device("cpu"), tmp)
        # the stop token of the third scenario, from a greedy run here; the peers run on `device`
        eos = pick_eos(run_astrai(TorchSampler(model=native, max_batch_size=args.batch), prompts,
                                  args.new_tokens, sample=False))
        print(f"model {args.model_type} ({args.size}) {native.num_parameters() / 1e6:.2f}M params, "
              f"batch {args.batch}, prompt lengths {min(map(len, prompts))}-{max(map(len, prompts))}, "
              f"up to {args.new_tokens} new tokens, {torch.get_num_threads()} threads, {device}, "
              f"each peer in its own process, runs interleaved")
        argv = _without(sys.argv[1:], "--device") + ["--device", str(device)]
        results = measure(args, argv, tmp, eos)
    figures = {"device": str(device), "scenarios": {}}
    for (label, sample, _), result in zip(SCENARIOS, results, strict=True):
        figures["scenarios"][label.format(eos=eos)] = report(label.format(eos=eos), result, sample)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


def _without(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (either spelling)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def report(label: str, results: dict[str, tuple[list[float], list[list[int]]]],
           sample: bool) -> dict[str, float | bool]:
    """Print one scenario's lines; its figures (tokens/s of each from its median run, and
    the ratio: the median of the per-round ratios, load changing between rounds hitting
    both runs of a round alike)."""
    rates, tokens = {}, {}
    for name, (seconds, outputs) in results.items():
        tokens[name] = sum(map(len, outputs))
        rates[name] = tokens[name] / statistics.median(seconds)
        print(f"  {label:36s} {name:13s} {rates[name]:9.0f} tokens/s ({tokens[name]} tokens; runs "
              f"{', '.join(f'{s:.3f}' for s in seconds)} s)")
    figures: dict[str, float | bool] = {f"{name}_tokens_per_second": rate for name, rate in rates.items()}
    if not sample:  # same weights, greedy: the same tokens (hence the same lengths)
        same = results["transformers"][1] == results["astrai"][1]
        print(f"  {label:36s} identical greedy outputs: {same}")
        figures["identical_greedy_outputs"] = same
    per_round = [(tokens["astrai"] / a) / (tokens["transformers"] / t)
                 for a, t in zip(results["astrai"][0], results["transformers"][0], strict=True)]
    figures["ratio"] = statistics.median(per_round)
    print(f"  {label:36s} ratio astrai / transformers: {figures['ratio']:.2f}x (median of "
          f"{len(per_round)} interleaved rounds: {', '.join(f'{r:.2f}' for r in per_round)})")
    return figures


if __name__ == "__main__":
    main()
