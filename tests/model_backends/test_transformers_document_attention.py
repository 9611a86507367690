"""Packed rows in the transformers backend, for the families astrai's attention runs: each
document of a packed row gets the log-probs of its own separate forward, a change in one
document leaves the others' logits bit for bit, and the row is attended document by
document (no attention over the whole row, so no [S, S] mask)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from astrai_core.model_backends.hf_attention import FAMILIES
from astrai_core.model_backends.transformers_lm import TransformersCausalLM
from astrai_core.testing.hf_models import tiny_causal_lm

# Gemma 3: a query scaling other than 1/sqrt(head_dim), and a sliding window (4) shorter
# than the documents; Mistral's window (6) too.
OVERRIDES = {"gemma3_text": {"query_pre_attn_scalar": 4}}
ROWS = ((5, 9, 4), (7, 6))  # documents per row; the second row ends in 5 padding tokens
WIDTH = 18


def _packed(docs: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    ids = torch.zeros(len(docs), WIDTH, dtype=torch.long)
    positions = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for row, row_docs in enumerate(docs):
        flat = torch.cat(row_docs)
        ids[row, :len(flat)] = flat
        positions[row, :len(flat)] = torch.cat([torch.arange(len(d)) for d in row_docs])
        positions[row, len(flat):] = torch.arange(1, WIDTH - len(flat) + 1) + positions[row, len(flat) - 1]
        mask[row, :len(flat)] = 1
    return {"input_ids": ids, "position_ids": positions, "attention_mask": mask}


def _documents(seed: int = 0) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randint(1, 64, (n,), generator=generator) for n in row] for row in ROWS]


def _spans(row: int):
    start = 0
    for index, length in enumerate(ROWS[row]):
        yield index, slice(start, start + length)
        start += length


@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_document_gets_its_own_forwards_logprobs(model_type, monkeypatch):
    model = TransformersCausalLM(tiny_causal_lm(model_type, **OVERRIDES.get(model_type, {}))).eval()
    assert model.astrai_attention
    docs = _documents()
    query_lengths = []
    sdpa = F.scaled_dot_product_attention

    def recorded(query, *args, **kwargs):
        query_lengths.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    with torch.no_grad():
        monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
        logits = model(**_packed(docs))["logits"]
        monkeypatch.undo()
        assert query_lengths and max(query_lengths) == max(max(row) for row in ROWS)
        for row, row_docs in enumerate(docs):
            for index, span in _spans(row):
                alone = model(row_docs[index][None])["logits"][0]
                torch.testing.assert_close(torch.log_softmax(logits[row, span], -1),
                                           torch.log_softmax(alone, -1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_changing_one_document_leaves_the_others_bit_for_bit(model_type):
    model = TransformersCausalLM(tiny_causal_lm(model_type, **OVERRIDES.get(model_type, {}))).eval()
    docs = _documents()
    changed = [list(row) for row in docs]
    changed[0][1] = (changed[0][1] % 60) + 1  # the middle document of the first row
    with torch.no_grad():
        before = model(**_packed(docs))["logits"]
        after = model(**_packed(changed))["logits"]
    assert not torch.equal(before[0, 5:14], after[0, 5:14])
    for row in range(len(ROWS)):
        for index, span in _spans(row):
            if (row, index) != (0, 1):
                assert torch.equal(before[row, span], after[row, span]), (row, index)
