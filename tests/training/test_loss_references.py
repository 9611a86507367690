"""The training loss, eval/loss, the gradient norm, clipping and the first AdamW step, each
against a hand computation on the same starting weights and documents."""

from __future__ import annotations

import pytest
import torch

from tests.training.reference import (TEXTS, checkpoint_weights, cross_entropy_sum, load_model,
                                      mean_cross_entropy, run, save_start_model, text_documents,
                                      text_run_config, write_texts)

LR, EPS = 1e-2, 1.0  # a large Adam eps makes the first step depend on the gradient's scale


def _hand_gradient(start_dir):
    """Loss, gradients by name and their global L2 norm, of the hand-written loss."""
    model = load_model(start_dir)
    loss = mean_cross_entropy(model, text_documents())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    norm = torch.sqrt(sum(g.double().square().sum() for g in grads.values()))
    return loss.item(), grads, norm.item(), model


def _first_adamw_step(weights, grads, clip_scale):
    """AdamW's first step (bias-corrected m = g, v = g^2, no decay): w - lr g / (|g| + eps)."""
    out = {}
    for name, g in grads.items():
        g = g * clip_scale
        out[name] = weights[name] - LR * g / (g.abs() + EPS)
    return out


@pytest.mark.parametrize("clip", [True, False], ids=["clipped", "unclipped"])
def test_first_step_loss_norm_clipping_and_update_equal_hand_computation(tmp_path, clip):
    start = save_start_model(tmp_path / "start")
    loss, grads, norm, model = _hand_gradient(start)
    max_norm = norm / 4 if clip else norm * 4
    config = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start, lr=LR,
                             eps=EPS, max_grad_norm=max_norm, betas=[0.9, 0.95])
    [record] = run(tmp_path, config)

    _, count = cross_entropy_sum(model, text_documents())
    assert record["loss"] == pytest.approx(loss, rel=1e-5)
    assert record["tokens"] == count
    assert record["grad_norm"] == pytest.approx(norm, rel=1e-4)  # logged before clipping
    assert record["lr"] == pytest.approx(LR)

    scale = min(1.0, max_norm / (norm + 1e-6))  # torch's clip_grad_norm_ convention
    start_weights = {n: p.detach() for n, p in model.named_parameters()}
    expected = _first_adamw_step(start_weights, grads, scale)
    other = _first_adamw_step(start_weights, grads, 1.0 if clip else 0.25)
    saved = checkpoint_weights(tmp_path / "run", 1)
    for name, value in expected.items():
        torch.testing.assert_close(saved[name], value, rtol=0, atol=2e-7, msg=name)
    # the check can tell clipped from unclipped updates apart
    assert max((expected[n] - other[n]).abs().max().item() for n in expected) > 1e-4


def test_eval_loss_is_the_token_weighted_cross_entropy_before_and_after_training(tmp_path):
    start = save_start_model(tmp_path / "start", seed=1)
    train_data = write_texts(tmp_path / "train.jsonl")
    held_out = ["3+4=7", "250+250=500", "8+1=9"]
    config = text_run_config(tmp_path, train_data, start, max_steps=3, eval_at_start=True)
    config["data"]["eval"] = {"path": str(write_texts(tmp_path / "eval.jsonl", held_out)),
                              "format": "text"}
    config["data"]["eval_batch_size"] = 2  # two batches with different token counts
    records = run(tmp_path, config)
    by_step = {r["step"]: r for r in records}
    documents = text_documents(held_out)
    assert by_step[0]["eval/loss"] == pytest.approx(
        mean_cross_entropy(load_model(start), documents).item(), rel=1e-5)
    final = load_model(tmp_path / "run" / "checkpoints" / "step_3")
    assert by_step[3]["eval/loss"] == pytest.approx(
        mean_cross_entropy(final, documents).item(), rel=1e-5)
    assert by_step[3]["eval/loss"] != pytest.approx(by_step[0]["eval/loss"], rel=1e-3)
    assert len(TEXTS) == config["data"]["batch_size"]  # one training batch holds every text
