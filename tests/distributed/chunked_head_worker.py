"""One rank of the chunked-head check under FSDP2: a native model sharded the way a run
shards it (``shard_module``: a unit per decoder layer, the root holding embedding, final
norm and head), through ``policy_forward`` (the chunked head inside the model's forward),
against the same model unsharded in this process through the full-logits path
(``token_logprobs`` / ``entropy_from_logits`` on [B, S, V] logits). float64, so the
tolerance tests the maths (FSDP still reduces gradients in float32: ~1e-7). Every rank feeds the same batch, so FSDP's
averaged gradients equal the single-process ones. Cases: an untied head, a tied one (the
embedding is the head), and a LoRA policy (adapter gradients, and the reference with its
adapter disabled)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import init_device_mesh

import astrai_core.model.head as head
from astrai_core.distributed.context import DistContext
from astrai_core.distributed.fsdp import shard_module
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.lora import DisabledAdapterReference, inject_lora
from astrai_core.rl.functional import entropy_from_logits, token_logprobs
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.forward import policy_forward
from tests.distributed.worker_kit import run_worker, write_rank_result

VOCAB, CHUNK, TEMPERATURE = 41, 4, 0.8
CONFIG = dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=40, num_layers=2,
              num_heads=3, num_kv_heads=1, head_dim=8)
PROMPT, RESPONSE, ROWS = 5, 6, 3  # 18 response tokens: chunks of 4, 4, 4, 4, 2


def rollout() -> RolloutBatch:
    generator = torch.Generator().manual_seed(7)
    prompt_mask = torch.ones(ROWS, PROMPT, dtype=torch.bool)
    prompt_mask[0, :2] = False  # left padding
    response_mask = torch.ones(ROWS, RESPONSE, dtype=torch.bool)
    response_mask[1, 4:] = False  # right padding
    return RolloutBatch(prompt_ids=torch.randint(0, VOCAB, (ROWS, PROMPT), generator=generator),
                        prompt_mask=prompt_mask,
                        response_ids=torch.randint(0, VOCAB, (ROWS, RESPONSE), generator=generator),
                        response_mask=response_mask, old_logprobs=None, rewards=torch.zeros(ROWS),
                        reward_components={}, group_ids=torch.arange(ROWS))


def full_logits_path(model: torch.nn.Module, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(batch.input_ids(), attention_mask=batch.attention_mask(),
                   position_ids=batch.position_ids())["logits"][:, PROMPT - 1:PROMPT + RESPONSE - 1]
    return (token_logprobs(logits, batch.response_ids, TEMPERATURE),
            entropy_from_logits(logits, TEMPERATURE))


def objective(logprobs: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A loss touching both outputs with a different weight per token."""
    mix = torch.linspace(-1, 1, mask.numel(), dtype=logprobs.dtype).reshape(mask.shape)
    return (torch.where(mask, logprobs * mix, 0).sum()
            + torch.where(mask, entropy * mix.flip(0), 0).sum())


class ChunkCounter:
    """Counts the chunked head's chunk computations (forward, and recompute in backward)."""

    def __init__(self) -> None:
        self.chunks = 0
        original = head._chunk_stats

        def counting(*args):
            self.chunks += 1
            return original(*args)

        head._chunk_stats = counting


def largest_saved_over_vocab(forward):
    """(forward(), the numel of the largest tensor over the vocabulary (logits or their
    softmax) that autograd keeps for the backward)."""
    largest = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() and tensor.shape[-1] == VOCAB:
            largest[0] = max(largest[0], tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return out, largest[0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach() - b.detach()).abs().max().item()


def grad_diffs(sharded: torch.nn.Module, reference: torch.nn.Module) -> dict[str, float]:
    grads = {name: p.grad.full_tensor() for name, p in sharded.named_parameters()
             if p.grad is not None}
    expected = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys(), sorted(grads.keys() ^ expected.keys())
    return {name: max_diff(grads[name], expected[name]) for name in expected}


def build(case: str) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**CONFIG, tie_word_embeddings=case == "tied")).double().train()
    if case == "lora":
        from peft import LoraConfig

        inject_lora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        model.double()
        with torch.no_grad():  # B = 0 at init: move it so the adapter changes the outputs
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
    return model


def check(case: str, ctx: DistContext) -> dict:
    reference = build(case)
    sharded = shard_module(copy.deepcopy(reference), ctx)
    batch, counter = rollout(), ChunkCounter()
    out, chunked_saved = largest_saved_over_vocab(
        lambda: policy_forward(sharded, batch, TEMPERATURE, return_entropy=True))
    forward_chunks = counter.chunks
    objective(out["logprobs"], out["entropy"], batch.response_mask).backward()
    (logprobs, entropy), full_saved = largest_saved_over_vocab(
        lambda: full_logits_path(reference, batch))
    objective(logprobs, entropy, batch.response_mask).backward()
    result = {"logprob_diff": max_diff(out["logprobs"], logprobs),
              "entropy_diff": max_diff(out["entropy"], entropy),
              "grad_diffs": grad_diffs(sharded, reference),
              "forward_chunks": forward_chunks, "all_chunks": counter.chunks,
              "chunked_saved": chunked_saved, "full_saved": full_saved}
    if case == "lora":  # the frozen reference: the sharded policy, its adapter disabled
        with torch.no_grad():
            ref = policy_forward(DisabledAdapterReference(sharded), batch, TEMPERATURE)
            base = copy.deepcopy(reference)
            from astrai_core.model.lora import adapter_disabled

            with adapter_disabled(base):
                expected, _ = full_logits_path(base.eval(), batch)
        result["reference_diff"] = max_diff(ref["logprobs"], expected)
        result["adapter_effect"] = max_diff(expected, logprobs)
    return result


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                      mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    head.CHUNK_LOGITS = CHUNK * VOCAB  # chunks of 4 tokens
    results = {case: check(case, ctx) for case in ("untied", "tied", "lora")}
    write_rank_result(out_dir, ctx.rank, results)


if __name__ == "__main__":
    run_worker(main)
