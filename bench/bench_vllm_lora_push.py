"""A LoRA policy's weight push into vLLM: merged weights (what the ``vllm`` sampler does)
vs vLLM's own LoRA support (``enable_lora=True`` + a PEFT adapter directory per push).

Model: Qwen3-shaped (default hidden 768, 4 layers, 12 heads / 4 KV heads of 64,
intermediate 2048, vocab 8192: ~40M parameters), float32, random, built with
transformers and imported; LoRA r=16 on every projection (astrai's ``model.lora``
defaults), adapter tensors random (a trained adapter, not peft's B = 0 start).

One RL step is "push the new policy, then generate a batch", so each of ``--rounds``
rounds changes the adapter in place (an optimizer step) and times, on each engine:

- merged: ``VllmSampler.update_weights()``: ``W + scale * B A`` per adapted module, the
  whole model renamed to Hugging Face names and reloaded into the running engine;
- native: the adapter written in PEFT's format with Hugging Face names (astrai's
  ``save_adapter``, what checkpoints hold), ``add_lora`` of it under a new id, the old
  id removed (an engine on the base weights, ``enable_lora=True``, ``max_lora_rank=r``);

then the first generation with those weights (batch x new tokens, temperature 1, seeded;
for native the adapter's activation into vLLM's LoRA slots happens there), and a second
one without a push in between (the steady-state generation cost). Medians are
printed with the ratio native / merged, the per-token cost native LoRA adds, and how
many generated tokens per push make the two equal. Greedy completions of both engines
are compared as a check that they compute the same model. The engines run one after
the other (never both at once). Needs vLLM (``make venv-vllm``, then):

    .venv-vllm/bin/python bench/bench_vllm_lora_push.py [--hidden 768] [--layers 4] [--batch 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch
from bench_vllm import make_prompts, timed  # the same prompts as the sampler benchmark

from astrai_core.config.lora import LORA_TARGETS as TARGETS  # every projection


def build_policy(args: argparse.Namespace, root: Path):
    """(base native model, LoRA policy on a copy of it): same base weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.config.lora import LoraSection
    from astrai_core.model.lora import adapter_parameters, inject_lora, peft_lora_config
    from astrai_core.plugins import load_plugins

    torch.manual_seed(0)
    heads = args.hidden // 64
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         intermediate_size=args.intermediate, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 3), head_dim=64,
                         max_position_embeddings=512, tie_word_embeddings=False)
    Qwen3ForCausalLM(config).float().save_pretrained(root / "hf")
    load_importer(load_plugins(), model_type="qwen3").import_checkpoint(root / "hf", root / "native")
    policy = inject_lora(load_pretrained(root / "native"),
                         peft_lora_config(**LoraSection(
                             r=args.rank, alpha=2.0 * args.rank,
                             target_modules=list(TARGETS)).adapter_settings()))
    with torch.no_grad():
        for param in adapter_parameters(policy).values():
            param.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
    return load_pretrained(root / "native"), policy


def optimizer_step(policy: torch.nn.Module, step: int) -> None:
    """Change every adapter tensor in place, as the trainer's optimizer does."""
    from astrai_core.model.lora import adapter_parameters

    generator = torch.Generator().manual_seed(100 + step)
    with torch.no_grad():
        for param in adapter_parameters(policy).values():
            param.add_(torch.randn(param.shape, generator=generator), alpha=1e-3)


def vllm_params(new_tokens: int, temperature: float):
    from vllm import SamplingParams

    return SamplingParams(n=1, max_tokens=new_tokens, temperature=temperature, seed=0,
                          ignore_eos=True, logprobs=0, detokenize=False)


def generate(engine, prompts, params, lora_request=None) -> list[list[int]]:
    from vllm.inputs import TokensPrompt

    outputs = engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                              lora_request=lora_request, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


class MergedPush:
    """The ``vllm`` sampler as it is: merged weights pushed into an engine on them."""

    name = "merged"

    def __init__(self, policy, options):
        from astrai_plugin_vllm.sampler import VllmSampler

        self.policy = policy
        self.sampler = VllmSampler(policy, **options)
        self.engine = self.sampler.engine

    def push(self) -> None:
        self.sampler.update_weights(None)

    def host_seconds(self) -> float:
        """The host side of a push alone: merge + rename to HF names (median of 3), under
        the same conditions as the pushes (the engine still running, its threads bound)."""
        from astrai_core.api import PER_EXPERT
        from astrai_plugin_vllm.weights import hf_weights

        importer = self.sampler._importer
        return statistics.median(timed(lambda: hf_weights(importer, self.policy, PER_EXPERT))[0]
                                 for _ in range(3))

    def generate(self, prompts, params):
        return generate(self.engine, prompts, params)

    def close(self):
        self.sampler.close()


class NativePush:
    """vLLM's LoRA: an engine on the base weights, the adapter loaded from a PEFT dir."""

    name = "native"

    def __init__(self, base, policy, options, rank: int, work: Path):
        from astrai_plugin_vllm.sampler import VllmSampler

        self.policy, self.work, self.version, self.request = policy, work, 0, None
        engine_kwargs = dict(enable_lora=True, max_lora_rank=rank, max_loras=1)
        self.sampler = VllmSampler(base, **options, engine_kwargs=engine_kwargs)
        self.engine = self.sampler.engine

    def push(self) -> None:
        from vllm.lora.request import LoRARequest

        from astrai_core.checkpoints.lora_files import save_adapter

        self.version += 1
        directory = save_adapter(self.policy, self.work / f"adapter-{self.version}", "qwen3")
        request = LoRARequest(f"policy-v{self.version}", self.version, str(directory))
        if not self.engine.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter {directory}")
        if self.request is not None:
            self.engine.llm_engine.remove_lora(self.request.lora_int_id)
        self.request = request

    def generate(self, prompts, params):
        return generate(self.engine, prompts, params, self.request)

    def close(self):
        self.sampler.close()


def measure(way, policy, prompts, params, rounds: int) -> dict[str, list[float]]:
    """Warm-up push + generation, then ``rounds`` of (optimizer step, push, generation)."""
    way.push()
    way.generate(prompts[:2], vllm_params(4, 1.0))
    times: dict[str, list[float]] = {"push": [], "generate": [], "again": []}
    for step in range(rounds):
        optimizer_step(policy, step)
        times["push"].append(timed(way.push)[0])
        for key in ("generate", "again"):  # again: no push in between (steady state)
            times[key].append(timed(lambda: way.generate(prompts, params))[0])
    return times


def run_way(make, policy, prompts, params, check_prompts, args) -> tuple[dict, list, float]:
    """Start one engine, measure it, take the greedy check, stop it."""
    startup, way = timed(make)
    try:
        state = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
        times = measure(way, policy, prompts, params, args.rounds)
        if hasattr(way, "host_seconds"):
            times["host"] = [way.host_seconds()]
        with torch.no_grad():  # the check runs on the same adapter for both ways
            for name, param in policy.named_parameters():
                if name in state:
                    param.copy_(state[name])
        way.push()
        greedy = way.generate(check_prompts, vllm_params(args.new_tokens, 0.0))
    finally:
        way.close()
    return times, greedy, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rank", type=int, default=16,
                        help="LoRA r, also vLLM's max_lora_rank (which takes 1, 8, 16, 32, ...)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("merged", "native"), default=None)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    options = dict(enforce_eager=device == "cpu", max_model_len=512, max_num_seqs=args.batch)
    if device == "cpu":
        options["cpu_kv_cache_gib"] = int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    prompts = make_prompts(args.batch, args.vocab)
    check_prompts = prompts[:4]
    params = vllm_params(args.new_tokens, 1.0)
    results: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-lora-") as root:
        root = Path(root)
        base, policy = build_policy(args, root)
        makers = {"merged": lambda: MergedPush(policy, options),
                  "native": lambda: NativePush(base, policy, options, args.rank, root)}
        for name, make in makers.items():
            if args.only in (None, name):
                try:
                    results[name] = run_way(make, policy, prompts, params, check_prompts, args)
                except Exception as exc:  # record why native LoRA fails on this vLLM
                    print(f"{name}: FAILED: {type(exc).__name__}: {exc}")
    report(args, device, policy, results)


def report(args, device, policy, results) -> None:
    import vllm

    from astrai_core.model.lora import adapter_parameters

    total = sum(p.numel() for n, p in policy.named_parameters() if "lora_" not in n)
    adapter = sum(p.numel() for p in adapter_parameters(policy).values())
    tokens = args.batch * args.new_tokens
    print(f"vLLM {vllm.__version__} on {device} ({torch.get_num_threads()} torch threads); qwen3 "
          f"hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}: {total / 1e6:.1f}M "
          f"parameters float32; LoRA r={args.rank} on {len(TARGETS)} projections "
          f"({adapter / 1e6:.2f}M adapter parameters); generation {args.batch} x "
          f"{args.new_tokens} tokens, temperature 1; median of {args.rounds} rounds")
    medians = {}
    for name, (times, _, startup) in results.items():
        push, gen, again = (statistics.median(times[key]) for key in ("push", "generate", "again"))
        medians[name] = (push, gen)
        print(f"  {name:6s}: push {push * 1e3:8.1f} ms   generate {gen:7.3f} s "
              f"({tokens / gen:7.1f} tok/s; again without a push {again:.3f} s)   "
              f"push + generate {push + gen:7.3f} s   engine start {startup:5.1f} s")
        if "host" in times:
            print(f"          of the push: merge + rename to HF names {times['host'][0] * 1e3:.1f} ms"
                  f", the rest vLLM's reload_weights and prefix-cache reset")
    if len(medians) == 2:
        (m_push, m_gen), (n_push, n_gen) = medians["merged"], medians["native"]
        per_token = (n_gen - m_gen) / tokens
        print(f"  ratio native / merged: push {n_push / m_push:.3f}x, generate "
              f"{n_gen / m_gen:.3f}x, push + generate {(n_push + n_gen) / (m_push + m_gen):.3f}x")
        print(f"  native LoRA adds {per_token * 1e3:.3f} ms per generated token "
              f"({(n_gen / m_gen - 1) * 100:+.1f}% generation time)")
        if per_token > 0:
            print(f"  break-even: merged is faster per step beyond "
                  f"{(m_push - n_push) / per_token:.0f} generated tokens per push")
        same = [a == b for a, b in zip(results["merged"][1], results["native"][1], strict=True)]
        print(f"  greedy check: {sum(same)}/{len(same)} completions identical across the two")


if __name__ == "__main__":
    main()
