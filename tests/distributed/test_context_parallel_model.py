"""Context parallelism in the native decoder, on 2 gloo processes: each rank's shard of the
rows gives the one-process log-probs of its positions, and the ranks' gradients sum to the
one-process gradient, for odd lengths, one KV head (replicated), packed documents that
straddle the shard boundary, padded rows and a sliding window; the all-to-alls are each
other's inverse."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.context_parallel import (heads_to_sequence, next_token_targets,
                                                sequence_to_heads, split_rows)
from astrai_core.model.head import chunked_logprobs, target_logprobs
from tests.distributed.spawn_kit import spawn_checks

WORLD = 2
TOL = 1e-5


def _model(**overrides) -> CausalLM:
    torch.manual_seed(7)
    config = ModelConfig(**{"vocab_size": 40, "hidden_size": 32, "intermediate_size": 48,
                            "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                            "max_position_embeddings": 64, **overrides})
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model


def _rows(case: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if case == "packed":  # one row of documents of 5 and 6 tokens: the boundary is at 6
        ids = torch.randint(1, 40, (1, 11), generator=generator)
        return {"input_ids": ids, "position_ids": torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]])}
    ids = torch.randint(1, 40, (2, 7), generator=generator)  # odd: padded to 8
    rows = {"input_ids": ids}
    if case == "padded":  # the second row has 4 real tokens
        rows["attention_mask"] = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    return rows


CASES = {"odd length": {}, "one kv head": {"num_kv_heads": 1}, "packed": {},
         "padded": {}, "sliding window": {"sliding_window": 3}}


def _check(rank: int, case: str) -> None:
    assert_shard_matches(_model(**CASES[case]), _rows(case), rank)


def assert_shard_matches(model: torch.nn.Module, rows: dict[str, torch.Tensor], rank: int,
                         grads_scaled: bool = False) -> None:
    """This rank's shard of ``rows`` gives ``model``'s one-process log-probs of its
    positions, and the ranks' gradients sum to the one-process gradient (within TOL, or
    TOL times each gradient's largest entry with ``grads_scaled``)."""
    ids = rows["input_ids"]
    loss_mask = rows.get("attention_mask", torch.ones_like(ids))
    # the one-process reference: log-probs of every next token, and a summed loss's grads
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
        scale = max(1.0, expected_grads[name].abs().max().item()) if grads_scaled else 1.0
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=TOL * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _inverse(rank: int, case: str) -> None:
    states = torch.arange(2 * 4 * 3 * 5, dtype=torch.float32).reshape(2, 4, 3, 5) + 1000 * rank
    shard = split_rows(torch.zeros(2, 6, dtype=torch.long), None, None, group=dist.group.WORLD,
                       size=WORLD, rank=rank)[1]
    heads = sequence_to_heads(states, shard)
    assert heads.shape == (2, 2, 6, 5)
    # rank r holds heads [2r, 2r + 2) of every token: rank 0's tokens first, then rank 1's
    assert torch.equal(heads[:, :, :3], states[:, 2 * rank:2 * rank + 2] - 1000 * rank)
    assert torch.equal(heads_to_sequence(heads, shard), states)


def _run(rank: int, case: str) -> None:
    (_inverse if case == "inverse" else _check)(rank, case)


@pytest.mark.parametrize("case", ["inverse", *CASES])
def test_context_parallel_equals_one_process(tmp_path, case):
    spawn_checks(tmp_path, _run, case, world=WORLD)
