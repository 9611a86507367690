"""A packed batch gives the same loss and gradients as its documents run one by one.

The rows come from the real loader (packed arithmetic chats and text); the reference runs
each document alone through the same tiny model, with no mask and default positions.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from astrai_core.data import DataConfig, build_train_loader
from astrai_core.model import CausalLM, ModelConfig

from .conftest import chat


@pytest.fixture
def model(arith_tokenizer):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(arith_tokenizer), hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
    return CausalLM(config).float()


def documents(batch):
    """(row, start, end) of every document, from position_ids and attention_mask alone."""
    spans = []
    for row in range(batch["input_ids"].shape[0]):
        positions = batch["position_ids"][row].tolist()
        real = int(batch["attention_mask"][row].sum())
        starts = [t for t in range(real) if positions[t] == 0]
        spans += [(row, s, e) for s, e in zip(starts, starts[1:] + [real])]
    return spans


def summed_loss(logits, input_ids, loss_mask):
    """Sum of next-token cross-entropies over the targets; loss_mask[t] marks token t."""
    targets = loss_mask[..., 1:]
    return F.cross_entropy(logits[..., :-1, :][targets], input_ids[..., 1:][targets], reduction="sum")


def loss_and_grads(model, compute):
    model.zero_grad()
    loss = compute()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("pack", [True, False])
def test_packed_batch_equals_documents_one_by_one(model, arith_tokenizer, write_jsonl, tmp_path, pack):
    chats = write_jsonl("chat.jsonl", [chat(f"{a}+{a * 7 % 50}=", str(a + a * 7 % 50))
                                       for a in range(30)])
    text = write_jsonl("text.jsonl", [{"text": f"{a}*{a % 9}={a * (a % 9)} ok"} for a in range(30)])
    cfg = DataConfig(sources=[{"path": str(chats), "format": "chat"},
                              {"path": str(text), "format": "text"}],
                     seq_len=32, batch_size=2, pack=pack, cache_dir=tmp_path / "cache")
    batch = next(build_train_loader(cfg, arith_tokenizer))
    spans = documents(batch)
    assert len(spans) > batch["input_ids"].shape[0] or not pack  # rows really hold several docs
    count = int(batch["loss_mask"].sum())

    def packed():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"])["logits"]
        return summed_loss(logits, batch["input_ids"], batch["loss_mask"]) / count

    def one_by_one():
        total = 0.0
        for row, start, end in spans:
            ids = batch["input_ids"][row:row + 1, start:end]
            logits = model(ids)["logits"]
            total = total + summed_loss(logits, ids, batch["loss_mask"][row:row + 1, start:end])
        return total / count

    packed_loss, packed_grads = loss_and_grads(model, packed)
    reference_loss, reference_grads = loss_and_grads(model, one_by_one)
    assert torch.allclose(packed_loss, reference_loss, rtol=0, atol=1e-5)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # A control: the same rows without the document boundaries give a different loss.
    with torch.no_grad():
        plain = model(batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
        leaked = summed_loss(plain, batch["input_ids"], batch["loss_mask"]) / count
    assert (abs(leaked - reference_loss) > 1e-3) == pack
