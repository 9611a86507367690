"""LoRA and the chunked head: peak memory of one GRPO loss forward + backward, and step time.

Model: Qwen3-0.6B-shaped (vocab 151,936, hidden 1024, 16 heads / 8 KV heads of 128,
intermediate 3072, q/k norms, tied embeddings) cut to 2 layers, float32, from scratch.

1. Peak memory, [batch, seq] tokens (default [4, 2048]: a 64-token prompt and the rest
   response): the GRPO loss (ppo_clip on the response log-probs, token-mean) forward and
   backward, through ``policy_forward`` with the chunked head (the default path) against
   the full-logits path (the same function on a model that only returns logits). At that
   size each step is ~10 TFLOP, too slow on this shared 2-core CPU, so the peak is taken
   by torch's MemTracker over fake tensors (the same code and autograd graph, shapes
   only); a real run at a smaller size (default [1, 1024], each in a fresh subprocess,
   peak RSS above the pre-step resident set, mmap'd large allocations) cross-checks it.
2. Step time, [time_batch, time_seq] tokens: a LoRA step (r=16, all projections, only the
   adapter in AdamW) against a full fine-tuning step (every weight in AdamW) on the same
   model, forward + backward + optimizer step, median of ``--reps`` after a warm-up.

    .venv/bin/python bench/bench_lora_memory.py [--seq 2048] [--rss-seq 1024] [--time-seq 256]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

QWEN3_06B_2L = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=2,
                    num_heads=16, num_kv_heads=8, head_dim=128, qk_norm=True,
                    tie_word_embeddings=True, max_position_embeddings=4096)
PROMPT = 64


def build_model(device: str):
    from astrai_core.model import CausalLM, ModelConfig

    torch.manual_seed(0)
    with torch.device(device):
        return CausalLM(ModelConfig(**QWEN3_06B_2L)).train()


class LogitsOnly(torch.nn.Module):
    """The model seen through its logits alone: policy_forward takes the full-logits path."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def rollout(batch: int, seq: int, device: str):
    from astrai_core.rollout.batch import RolloutBatch

    class FullRows(RolloutBatch):
        """Rows without padding: no mask and default positions (plain causal attention,
        as the masks would give), so nothing depends on the tensors' values."""

        def attention_mask(self):
            return None

        def position_ids(self):
            return None

    if seq <= PROMPT:
        raise SystemExit(f"--seq/--time-seq must exceed the {PROMPT}-token prompt")
    generator = torch.Generator().manual_seed(1)
    vocab = QWEN3_06B_2L["vocab_size"]
    prompts = torch.randint(0, vocab, (batch, PROMPT), generator=generator)
    responses = torch.randint(0, vocab, (batch, seq - PROMPT), generator=generator)
    return FullRows(
        prompt_ids=prompts, prompt_mask=torch.ones_like(prompts, dtype=torch.bool),
        response_ids=responses, response_mask=torch.ones_like(responses, dtype=torch.bool),
        old_logprobs=None, rewards=torch.zeros(batch), reward_components={},
        group_ids=torch.zeros(batch, dtype=torch.long)).to(device)


def grpo_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """ppo_clip with old = current (detached) log-probs and unit-normal advantages."""
    from astrai_core.rl.functional import aggregate_loss, clipped_policy_loss
    from astrai_core.rollout.forward import policy_forward

    logp = policy_forward(model, batch, 1.0)["logprobs"]
    advantages = torch.randn(logp.shape, generator=torch.Generator().manual_seed(2)).to(logp.device)
    per_token, _ = clipped_policy_loss(logp, logp.detach(), advantages, batch.response_mask,
                                       0.2, 0.2)
    return aggregate_loss(per_token, batch.response_mask, "token-mean")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tracked_peak(path: str, batch: int, seq: int) -> int:
    """Peak bytes of live tensors during the step, beyond the model's own weights, with
    torch's MemTracker over fake tensors: the exact tensor-level peak (allocator slack
    aside) of the same code, shapes and autograd graph, without doing the arithmetic."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        model = build_model("cpu")
        inputs = rollout(batch, seq, "cpu")
        target = model if path == "chunked" else LogitsOnly(model)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            grpo_loss(target, inputs).backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return sum(v for k, v in peak.items() if k != "Total" and k.name not in ("PARAM", "BUFFER"))


def measure_rss(path: str, batch: int, seq: int) -> dict:
    """The real run (a fresh process): ru_maxrss during the step minus the resident set
    just before it; large allocations go through mmap so the resident set follows live
    memory."""
    model = build_model("cpu")
    inputs = rollout(batch, seq, "cpu")
    target = model if path == "chunked" else LogitsOnly(model)
    before, peak_before = rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grpo_loss(target, inputs).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # an earlier, higher peak (the model build) would hide the step's: say so
    return {"path": path, "peak_bytes": peak - before, "clean": peak_before <= before * 1.05}


def run_child(args: argparse.Namespace, path: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    command = [sys.executable, __file__, "--child", path, "--batch", str(args.rss_batch),
               "--seq", str(args.rss_seq)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_seconds(lora: bool, batch: int, seq: int, reps: int, device: str) -> float:
    from astrai_core.config.lora import LoraSection
    from astrai_core.model.lora import inject_lora, peft_lora_config

    model = build_model(device)
    if lora:
        inject_lora(model, peft_lora_config(**LoraSection(r=16, alpha=32).adapter_settings()))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    inputs = rollout(batch, seq, device)
    times = []
    for rep in range(reps + 1):
        start = time.perf_counter()
        grpo_loss(model, inputs).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rep:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--rss-batch", type=int, default=1, help="the real-run cross-check")
    parser.add_argument("--rss-seq", type=int, default=1024)
    parser.add_argument("--time-batch", type=int, default=1)
    parser.add_argument("--time-seq", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_rss(args.child, args.batch, args.seq)))
        return
    gib = 1024**3
    print("GRPO loss forward+backward, Qwen3-0.6B-shaped 2-layer model (186M params), float32, CPU")
    tracked = {path: tracked_peak(path, args.batch, args.seq) for path in ("chunked", "full")}
    print(f"  [{args.batch}, {args.seq}] tokens, tensor-level peak beyond the weights (MemTracker):")
    print(f"    full-logits path {tracked['full'] / gib:.2f} GiB, chunked path "
          f"{tracked['chunked'] / gib:.2f} GiB, chunked / full = "
          f"{tracked['chunked'] / tracked['full']:.3f} (aim <= 0.25)")
    real = {path: run_child(args, path) for path in ("chunked", "full")}
    chunked, full = real["chunked"]["peak_bytes"], real["full"]["peak_bytes"]
    note = "" if all(r["clean"] for r in real.values()) else " (lower bounds: an earlier peak)"
    print(f"  [{args.rss_batch}, {args.rss_seq}] tokens, real run, peak RSS above the pre-step "
          f"resident set{note}:")
    print(f"    full-logits path {full / gib:.2f} GiB, chunked path {chunked / gib:.2f} GiB, "
          f"chunked / full = {chunked / full:.3f}")
    small = {path: tracked_peak(path, args.rss_batch, args.rss_seq) for path in ("chunked", "full")}
    print(f"    (MemTracker at that size: full {small['full'] / gib:.2f} GiB, chunked "
          f"{small['chunked'] / gib:.2f} GiB: the method agrees with the real run)")
    lora_s = step_seconds(True, args.time_batch, args.time_seq, args.reps, "cpu")
    full_s = step_seconds(False, args.time_batch, args.time_seq, args.reps, "cpu")
    print(f"  step time [{args.time_batch}, {args.time_seq}] tokens (GRPO loss forward+backward+"
          f"AdamW, median of {args.reps}): LoRA r=16 {lora_s:.2f} s, full fine-tune "
          f"{full_s:.2f} s, LoRA / full = {lora_s / full_s:.2f}")


if __name__ == "__main__":
    main()
