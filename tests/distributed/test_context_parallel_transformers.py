"""Context parallelism in the transformers backend, on 2 gloo processes: each rank's shard of
the rows, attended through astrai's attention inside the family's own layers, gives the
one-process log-probs of its positions, and the ranks' gradients sum to the one-process
gradient: odd lengths, one KV head (replicated over the 2 ranks), packed documents that
straddle the shard boundary, padded rows, Mistral's and Gemma 3's sliding windows, and
layers recomputed in the backward (activation checkpointing)."""

from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from astrai_core.model.context_parallel import next_token_targets, split_rows
from astrai_core.model.head import chunked_logprobs, target_logprobs
from astrai_core.model_backends.transformers_lm import TransformersCausalLM
from astrai_core.testing.hf_models import tiny_causal_lm

WORLD = 2
TOL = 1e-5
PACKED = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]])  # documents of 5 and 6: boundary at 6

# case: (model_type, overrides of its tiny config, rows)
CASES = {
    "llama odd length": ("llama", {}, "odd"),
    "llama one kv head": ("llama", {"num_key_value_heads": 1}, "odd"),
    "llama packed": ("llama", {}, "packed"),
    "qwen3 packed one kv head": ("qwen3", {"num_key_value_heads": 1}, "packed"),
    "qwen3 packed checkpointed": ("qwen3", {}, "packed"),
    "qwen3 padded": ("qwen3", {}, "padded"),
    "mistral sliding window": ("mistral", {"sliding_window": 3}, "odd"),
    "gemma3 sliding window": ("gemma3_text", {"query_pre_attn_scalar": 4}, "odd"),
    "gemma3 packed sliding window": ("gemma3_text", {"sliding_window": 3}, "packed"),
}


def _rows(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if kind == "packed":
        return {"input_ids": torch.randint(1, 64, (1, 11), generator=generator),
                "position_ids": PACKED}
    rows = {"input_ids": torch.randint(1, 64, (2, 9), generator=generator)}  # 9: padded to 10
    if kind == "padded":  # the second row has 4 real tokens
        rows["attention_mask"] = torch.tensor([[1] * 9, [1] * 4 + [0] * 5])
    return rows


def _check(rank: int, case: str) -> None:
    model_type, overrides, kind = CASES[case]
    model = TransformersCausalLM(tiny_causal_lm(model_type, seed=5, **overrides))
    assert model.astrai_attention
    if "checkpointed" in case:  # the layers recomputed in the backward, all-to-alls too
        model.train()
        model.enable_activation_checkpointing()
    rows = _rows(kind)
    ids = rows["input_ids"]
    loss_mask = rows.get("attention_mask", torch.ones_like(ids))
    reference = target_logprobs(model, ids, ids[:, 1:], attention_mask=rows.get("attention_mask"),
                                position_ids=rows.get("position_ids"))["logprobs"]
    trained = loss_mask[:, 1:].bool()
    (-torch.where(trained, reference, 0.0).sum()).backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    local, shard = split_rows(ids, rows.get("attention_mask"), rows.get("position_ids"),
                              group=dist.group.WORLD, size=WORLD, rank=rank)
    targets, mine = next_token_targets(ids, loss_mask, shard)

    def head(hidden, weight):
        return {"logprobs": chunked_logprobs(hidden, weight, targets)[0].clone()}

    logprobs = model(local, context_shard=shard, head=head)["logprobs"]
    (-torch.where(mine, logprobs, 0.0).sum()).backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    for grad in grads.values():  # every collective before any assertion: no rank waits
        dist.all_reduce(grad)
    width = local.shape[1]
    padded = torch.nn.functional.pad(reference, (0, shard.positions.shape[1] - reference.shape[1]))
    want = padded[:, rank * width:(rank + 1) * width]
    assert mine.any()  # each rank has targets of its own
    torch.testing.assert_close(torch.where(mine, logprobs, 0.0), torch.where(mine, want, 0.0),
                               rtol=0, atol=TOL)
    for name, grad in grads.items():
        # within 1e-5 of the gradient's scale: Gemma's scaled embeddings make entries ~100,
        # whose float32 sums in another order differ by ~1e-4
        scale = max(1.0, expected_grads[name].abs().max().item())
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=TOL * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _worker(rank: int, init: str, case: str, errors) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    try:
        _check(rank, case)
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    dist.barrier()  # neither rank takes the group down while the other still uses it
    dist.destroy_process_group()
    # torch 2.13's gloo sometimes aborts a process in the interpreter's teardown
    # ("terminate called"), after its work is done: leave without it
    os._exit(0)


@pytest.mark.parametrize("case", CASES)
def test_context_parallel_equals_one_process(tmp_path, case):
    errors = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(f"file://{tmp_path / 'store'}", case, errors), nprocs=WORLD)
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert not problems, "\n".join(problems)
