"""Delta weight pushes (``sampler: {name: ray, push: delta}``) against full bucketed pushes,
measured in one run on one local Ray.

The policy has Qwen3-0.6B's shapes (hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072,
vocabulary 151936, tied embedding) in bf16; ``--layers`` sets the depth (Qwen3-0.6B has
28). It trains ``--steps`` AdamW steps at ``--lr`` (default 1e-6) on random token batches;
after each step the same weights are pushed to two ray samplers of one worker each, one
with ``push: full`` and one with ``push: delta`` (same transport: a gloo group on CPU).
Per push it records the bytes sent and the trainer's whole wait
(``rollout/weight_push_wait_seconds``, which for a delta push includes comparing and
hashing on the trainer and applying and hashing on the worker); the first push of the
delta sampler is whole (nothing to compare against) and is reported apart. At the end
both workers' states are checked against the trainer's by digest (``verify_weights``).

``--sampler vllm`` (run in ``.venv-vllm``) pushes instead to two colocated vLLM engines
in this process (``sampler: {name: vllm, push: full | delta}``); its time is
``rollout/weight_push_seconds``: gather, encode, apply and verify, and the engine's
whole reload; only the delta engine's copy is checked by digest at the end.

    .venv/bin/python bench/bench_delta_push.py [--layers 2] [--steps 10] [--lr 1e-6]
    .venv-vllm/bin/python bench/bench_delta_push.py --sampler vllm
"""

from __future__ import annotations

import argparse
import json
import statistics

SHAPE = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_heads=16,
             num_kv_heads=8, head_dim=128, qk_norm=True, tie_word_embeddings=True)
MB = 2**20


def train_step(model, optimizer, step: int, tokens: int) -> None:
    import torch

    ids = torch.randint(0, SHAPE["vocab_size"], (1, tokens),
                        generator=torch.Generator().manual_seed(step))
    logits = model(ids)["logits"][:, :-1].reshape(-1, SHAPE["vocab_size"]).float()
    loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def push(sampler) -> dict[str, float]:
    sampler.update_weights()
    return sampler.metrics()


def summary(pushes: list[dict[str, float]]) -> dict[str, float]:
    key = ("rollout/weight_push_wait_seconds" if "rollout/weight_push_wait_seconds" in pushes[0]
           else "rollout/weight_push_seconds")  # vllm: no transfer to wait for
    return {"mb_per_push": statistics.mean(p["rollout/weight_push_mb"] for p in pushes),
            "seconds_per_push": statistics.median(p[key] for p in pushes)}


def start_samplers(kind: str, model, bucket_mb: float) -> dict:
    """{"full": sampler, "delta": sampler} of ``kind`` (ray or vllm) on ``model``."""
    if kind == "vllm":
        from astrai_plugin_vllm.sampler import VllmSampler

        common = dict(enforce_eager=True, max_model_len=256, max_num_seqs=4,
                      cpu_kv_cache_gib=1, weight_bucket_mb=max(1, int(bucket_mb)))
        return {kind: VllmSampler(model, push=kind, **common) for kind in ("full", "delta")}
    import ray

    from astrai_plugin_ray.sampler import RaySampler

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    common = dict(model=model, workers=1, worker_resources={"CPU": 0.5},
                  weight_transport="collective", bucket_mb=bucket_mb)
    return {kind: RaySampler(**common, push=kind) for kind in ("full", "delta")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per training batch")
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--sampler", choices=["ray", "vllm"], default="ray")
    args = parser.parse_args()

    import torch

    from astrai_core.api import CausalLM, ModelConfig

    torch.manual_seed(0)
    model = CausalLM(ModelConfig(num_layers=args.layers, **SHAPE)).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    samplers = start_samplers(args.sampler, model, args.bucket_mb)
    try:
        pushes: dict[str, list[dict[str, float]]] = {"full": [], "delta": []}
        for step in range(args.steps):
            train_step(model, optimizer, step, args.tokens)
            for name, sampler in samplers.items():
                pushes[name].append(push(sampler))
        for kind, sampler in samplers.items():
            if args.sampler == "ray" or kind == "delta":  # a vllm engine keeps no copy otherwise
                sampler.verify_weights()
    finally:
        for sampler in samplers.values():
            sampler.close()
        if args.sampler == "ray":
            import ray

            ray.shutdown()
    full, delta = summary(pushes["full"]), summary(pushes["delta"][1:])
    results = {"sampler": args.sampler, "layers": args.layers, "steps": args.steps, "lr": args.lr,
               "state_mb": sum(t.numel() * t.element_size()
                               for t in model.state_dict().values()) / MB,
               "full": full, "delta": delta, "delta_first_push": summary(pushes["delta"][:1]),
               "bytes_ratio_full_over_delta": full["mb_per_push"] / delta["mb_per_push"],
               "time_ratio_full_over_delta": full["seconds_per_push"] / delta["seconds_per_push"],
               "verified": True}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
