"""Packed rows: attention computed per document (model/document_attention.py).

References: the same documents run one per row (padded), and the documents themselves.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model import document_attention as doc_attn
from astrai_core.model.masks import build_attention_bias, document_ids

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
            qk_norm=True, attention_bias=True, rope_theta=1000.0)
KV_HEADS = pytest.mark.parametrize("kv_heads", [4, 1], ids=["mha", "gqa1"])
# Two packed rows, right-padded to one width; documents of lengths 1 and 7 included.
ROWS = [[[5, 9, 12, 7], [33], [3, 8, 1, 60, 61, 62, 2]], [[40, 41, 42, 43, 44], [17, 18]]]


def make_model(**overrides) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():  # non-trivial norm weights and biases
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.uniform_(0.5, 1.5)
    return model


def packed(rows: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, position_ids, attention_mask of ``rows`` packed, as SFT packing lays them
    out (padding's positions continue the row's last document)."""
    width = max(sum(map(len, row)) for row in rows)
    ids, pos, mask = (torch.zeros(len(rows), width, dtype=torch.long) for _ in range(3))
    for b, row in enumerate(rows):
        flat = [t for doc in row for t in doc]
        positions = [p for doc in row for p in range(len(doc))]
        positions += range(positions[-1] + 1, positions[-1] + 1 + width - len(flat))
        ids[b, :len(flat)] = torch.tensor(flat)
        pos[b] = torch.tensor(positions)
        mask[b, :len(flat)] = 1
    return ids, pos, mask


def document_logits(model: CausalLM, rows: list[list[list[int]]]) -> list[torch.Tensor]:
    """Each document's logits from the packed forward, in order."""
    ids, pos, mask = packed(rows)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=pos)["logits"]
    out = []
    for b, row in enumerate(rows):
        t = 0
        for doc in row:
            out.append(logits[b, t:t + len(doc)])
            t += len(doc)
    return out


def unpacked_logits(model: CausalLM, rows: list[list[list[int]]]) -> list[torch.Tensor]:
    """Each document alone in its row, the rows right-padded: the plain padded path."""
    documents = [doc for row in rows for doc in row]
    width = max(map(len, documents))
    ids = torch.zeros(len(documents), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, doc in enumerate(documents):
        ids[i, :len(doc)] = torch.tensor(doc)
        mask[i, :len(doc)] = 1
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)["logits"]
    return [logits[i, :len(doc)] for i, doc in enumerate(documents)]


@KV_HEADS
def test_other_documents_are_bit_identical_when_one_changes(kv_heads):
    model = make_model(num_kv_heads=kv_heads)
    before = document_logits(model, ROWS)
    changed = [[list(doc) for doc in row] for row in ROWS]
    changed[0][2] = [90, 91, 92, 93, 94, 95, 1]  # the third document of the first row
    after = document_logits(model, changed)
    assert not torch.equal(before[2], after[2])
    for i in (0, 1, 3, 4):
        assert torch.equal(before[i], after[i]), f"document {i} moved"


@KV_HEADS
@pytest.mark.parametrize("window", [None, 3], ids=["full", "window3"])
def test_packed_equals_one_document_per_row(kv_heads, window):
    model = make_model(num_kv_heads=kv_heads, sliding_window=window)
    got, expected = document_logits(model, ROWS), unpacked_logits(model, ROWS)
    for a, b in zip(got, expected):
        assert (a - b).abs().max().item() <= 1e-5
        # the log-probs of the next tokens, which the losses use
        assert (a.log_softmax(-1) - b.log_softmax(-1)).abs().max().item() <= 1e-5
    dense = unpacked_logits(make_model(num_kv_heads=kv_heads), ROWS)
    if window is not None:  # the window applies within each packed document
        assert (got[2] - dense[2]).abs().max().item() > 1e-4


def test_attention_is_computed_per_document(monkeypatch):
    """No attention call spans more keys than the longest document (the dense mask's
    call would span the whole row)."""
    seen: list[int] = []
    sdpa = F.scaled_dot_product_attention

    def recording(query, key, value, **kwargs):
        seen.append(key.shape[-2])
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = make_model(num_kv_heads=2)
    document_logits(model, ROWS)
    longest = max(len(doc) for row in ROWS for doc in row)
    assert seen and max(seen) == longest


def test_gradients_match_one_document_per_row():
    model = make_model(num_kv_heads=2).train()
    ids, pos, mask = packed(ROWS)
    model(ids, attention_mask=mask, position_ids=pos)["logits"][mask.bool()].square().sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    documents = [doc for row in ROWS for doc in row]
    sum(model(torch.tensor([doc]))["logits"][0].square().sum() for doc in documents).backward()
    for got, expected in zip(packed_grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_padding_inside_a_document_keeps_the_dense_mask():
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 1]])  # a hole in the first document
    assert doc_attn.document_layout(document_ids(positions), mask) is None
    bias = build_attention_bias(query_len=7, past_len=0, attention_mask=mask, position_ids=positions,
                                sliding_window=None, dtype=torch.float32, device=torch.device("cpu"))
    assert bias.documents is None and bias.mask is not None


def test_layout_of_packed_rows():
    _, pos, mask = packed(ROWS)
    layout = doc_attn.document_layout(document_ids(pos), mask)
    # row 0: 4 + 1 + 7 real; row 1: 5 + 2 real, then 5 padding (width 12)
    assert layout.spans == [(0, 4, True), (4, 5, True), (5, 12, True), (12, 17, True),
                            (17, 19, True), (19, 24, False)]
    assert layout.cu_seqlens.tolist() == [0, 4, 5, 12, 17, 19, 20, 21, 22, 23, 24]
    assert layout.cu_seqlens.dtype == torch.int32 and layout.max_len == 7


def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, dropout_p, causal, window_size):
    """flash_attn_varlen_func's contract, in plain torch (a reference for the call)."""
    assert causal and dropout_p == 0.0
    assert max_q == int((cu_q[1:] - cu_q[:-1]).max()) and max_k == int((cu_k[1:] - cu_k[:-1]).max())
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = []
    for a, b, c, d in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(),
                          cu_k[1:].tolist()):
        scores = torch.einsum("qhd,khd->hqk", q[a:b], k[c:d]) / q.shape[-1] ** 0.5
        # causal, aligned to the end of the keys (flash-attn >= 2.1 with more keys)
        query_pos, key_pos = torch.arange(b - a) + (d - c) - (b - a), torch.arange(d - c)
        allowed = key_pos[None, :] <= query_pos[:, None]
        if window_size[0] >= 0:
            allowed &= key_pos[None, :] >= query_pos[:, None] - window_size[0]
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", weights, v[c:d]))
    return torch.cat(out)


@pytest.mark.parametrize("window", [None, 3], ids=["full", "window3"])
def test_varlen_kernel_call_matches_per_document_sdpa(monkeypatch, window):
    model = make_model(num_kv_heads=2, sliding_window=window)
    expected = document_logits(model, ROWS)
    monkeypatch.setattr(doc_attn, "_varlen_kernel", lambda q: fake_varlen)
    for a, b in zip(document_logits(model, ROWS), expected):
        assert (a - b).abs().max().item() <= 1e-5


def test_varlen_kernel_only_on_cuda_half_precision():
    assert doc_attn._varlen_kernel(torch.zeros(2, 2, dtype=torch.bfloat16)) is None  # CPU


def test_activation_checkpointing_keeps_the_packed_gradients():
    model = make_model(num_kv_heads=2).train()
    ids, pos, mask = packed(ROWS)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        model(ids, attention_mask=mask, position_ids=pos)["logits"][mask.bool()].square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.gradient_checkpointing = True
    for got, expected in zip(grads(), plain):
        assert torch.equal(got, expected)


def test_scores_scaled_and_capped_per_document():
    """A packed row's documents under a query scaling and Gemma 2's logit softcap: each
    document's attention is the capped softmax written out by hand, GQA included."""
    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, h, 9, 8, generator=generator) for h in (4, 2, 2))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    layout = doc_attn.document_layout(document_ids(positions), None)
    scores = doc_attn.Scores(scale=0.3, softcap=2.0)
    out = doc_attn.document_attention(q, k, v, layout, None, scores)
    for start, end in ((0, 4), (4, 9)):
        keys, values = (t[:, :, start:end].repeat_interleave(2, dim=1) for t in (k, v))
        logits = 2.0 * torch.tanh(q[:, :, start:end] @ keys.transpose(-1, -2) * 0.3 / 2.0)
        causal = torch.ones(end - start, end - start, dtype=torch.bool).tril()
        expected = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1) @ values
        torch.testing.assert_close(out[:, start:end], expected.transpose(1, 2), rtol=0, atol=1e-6)
