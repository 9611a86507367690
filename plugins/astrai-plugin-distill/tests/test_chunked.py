"""The chunked path equals the unchunked one: chunked_logits_map, and the strategy's loss
against full logits of both models."""

from __future__ import annotations

import pytest
import torch

from astrai_core.api import aggregate_loss, chunked_logits_map
from astrai_core.testing import build_strategy
from astrai_plugin_distill.losses import generalized_jsd


def test_chunked_logits_map_equals_one_pass():
    torch.manual_seed(0)
    hs = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    ws = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    ht = torch.randn(10, 4, dtype=torch.float64)
    wt = torch.randn(13, 4, dtype=torch.float64)
    targets = torch.randint(0, 13, (10,))

    def loss(s, t, y):
        return generalized_jsd(s, t, 0.3, 1.5) + s.gather(-1, y[:, None])[:, 0]

    whole = loss(hs @ ws.T, ht @ wt.T, targets)
    grads = torch.autograd.grad(whole.sum(), (hs, ws))
    for chunk in (1, 3, 10, 64):
        got = chunked_logits_map(loss, [(hs, ws), (ht, wt)], targets, chunk_tokens=chunk)
        torch.testing.assert_close(got, whole, rtol=1e-12, atol=1e-12)
        for mine, ref in zip(torch.autograd.grad(got.sum(), (hs, ws)), grads):
            torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="same number of rows"):
        chunked_logits_map(loss, [(hs, ws), (ht[:3], wt)], targets)


@pytest.mark.parametrize("strategy", [
    {"loss": "reverse_kl"}, {"loss": "forward_kl", "top_k": 5}, {"loss": "jsd", "beta": 0.2},
    {"loss": "jsd", "beta": 0.7, "temperature": 1.7, "loss_aggregation": "seq-mean-token-sum"},
])
def test_strategy_loss_equals_full_logits(tmp_path, chats, teacher, strategy, monkeypatch, distill_config):
    import astrai_core.model.head as head

    config = distill_config(tmp_path, chats, teacher, on_policy_fraction=0.0, **strategy)
    distill, run = build_strategy(config, tmp_path)
    batch = distill.batch_source().next_step()[0]
    monkeypatch.setattr(head, "CHUNK_LOGITS", 32 * 3)  # three rows per chunk: many chunks
    loss, metrics = distill.compute_loss(batch)
    grads = torch.autograd.grad(loss, [p for p in run.model.parameters()])

    ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:].bool()
    forward = {"attention_mask": batch["attention_mask"], "position_ids": batch["position_ids"]}
    s_logits = run.model(ids, **forward)["logits"][:, :-1][mask]
    with torch.no_grad():
        t_logits = distill.teacher(ids, **forward)["logits"][:, :-1][mask]
    per_token = torch.zeros(mask.shape).masked_scatter(
        mask, distill.token_loss(s_logits, t_logits, ids[:, 1:][mask]))
    expected = aggregate_loss(per_token, mask, distill.config.loss_aggregation)
    expected_grads = torch.autograd.grad(expected, [p for p in run.model.parameters()])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for mine, ref in zip(grads, expected_grads):
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-6)
    assert metrics["tokens"].item() == mask.sum().item() > 0


def test_sampled_estimator_is_the_log_prob_gap_of_the_row_tokens(tmp_path, chats, teacher,
                                                                 distill_config):
    """estimator: sampled on the student's own samples: the loss is the mean over response
    tokens of log p_s(y) - log p_t(y), both taken by the core's target_logprobs."""
    from astrai_core.api import target_logprobs

    config = distill_config(tmp_path, chats, teacher, loss="reverse_kl", estimator="sampled",
                            temperature=1.3, on_policy_fraction=1.0)
    distill, run = build_strategy(config, tmp_path)
    batch = distill.batch_source().next_step()[0]
    assert batch["on_policy"].all()
    loss, _ = distill.compute_loss(batch)
    ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:].bool()
    forward = {"attention_mask": batch["attention_mask"], "position_ids": batch["position_ids"]}
    with torch.no_grad():
        student = target_logprobs(run.model, ids, ids[:, 1:], 1.3, **forward)["logprobs"]
        teacher_lp = target_logprobs(distill.teacher, ids, ids[:, 1:], 1.3, **forward)["logprobs"]
    assert loss.item() == pytest.approx((student - teacher_lp)[mask].mean().item(), rel=1e-5)


def test_models_without_the_chunked_head_take_their_full_logits(tmp_path, chats, teacher,
                                                                distill_config, monkeypatch):
    """A student or teacher whose forward has no chunked head (a transformers-backend
    model) is scored from its logits, with the same loss as the chunked path."""
    import astrai_plugin_distill.forward as forward
    import astrai_plugin_distill.teacher as teacher_module

    config = distill_config(tmp_path, chats, teacher, loss="jsd", beta=0.4,
                            on_policy_fraction=0.0)
    distill, _ = build_strategy(config, tmp_path)
    batch = distill.batch_source().next_step()[0]
    chunked, _ = distill.compute_loss(batch)
    for plain in ((forward,), (teacher_module,), (forward, teacher_module)):
        with monkeypatch.context() as patch:
            for module in plain:  # the student's, the teacher's, then both lack it
                patch.setattr(module, "has_chunked_head", lambda model: False)
            unchunked, _ = distill.compute_loss(batch)
        assert unchunked.item() == pytest.approx(chunked.item(), rel=1e-5)
