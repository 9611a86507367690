"""grad_accum_steps 2 with batch b equals grad_accum_steps 1 with batch 2b (real runs,
equal up to reduction order), and keep_last prunes to the newest checkpoints."""

from __future__ import annotations

import pytest
import torch

from tests.training.reference import (checkpoint_weights, run, save_start_model,
                                      text_run_config, write_texts)

# Equal token counts per document, so the mean over a batch of 2b equals the mean of the
# two micro-batch means: the two runs compute the same gradient.
SAME_LENGTH = ["11+22=33", "12+34=46", "40+40=80", "50+13=63", "27+31=58", "19+70=89",
               "33+33=66", "41+15=56"]


def _run(tmp_path, start, data, name, batch_size, accum):
    config = text_run_config(tmp_path, data, start, out=name, max_steps=4, lr=3e-3,
                             schedule="cosine", warmup_steps=1, grad_accum_steps=accum,
                             max_grad_norm=0.5, weight_decay=0.1)
    config["data"]["batch_size"] = batch_size
    return run(tmp_path, config, f"{name}.yaml")


def test_two_micro_batches_of_b_equal_one_batch_of_2b(tmp_path):
    start = save_start_model(tmp_path / "start")
    data = write_texts(tmp_path / "docs.jsonl", SAME_LENGTH)
    accumulated = _run(tmp_path, start, data, "accum", batch_size=2, accum=2)
    whole = _run(tmp_path, start, data, "whole", batch_size=4, accum=1)
    assert [r["step"] for r in accumulated] == [r["step"] for r in whole] == [1, 2, 3, 4]
    for a, w in zip(accumulated, whole, strict=True):
        assert a["tokens"] == w["tokens"] == 4 * 8   # 4 documents of 8 targets per step
        for name in ("loss", "grad_norm"):
            assert a[name] == pytest.approx(w[name], rel=1e-5), (a["step"], name)
        assert a["lr"] == w["lr"]
    ours, theirs = checkpoint_weights(tmp_path / "accum", 4), checkpoint_weights(tmp_path / "whole", 4)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    assert ours.keys() == theirs.keys()
    # and the runs did train
    assert accumulated[-1]["loss"] < accumulated[0]["loss"]


# Documents of 3 to 12 targets: micro-batch means of unequal token counts. The step must
# still equal one batch of all of them (the loss reports its token count as loss_weight).
MIXED_LENGTH = ["1+2=3", "12+34=46", "400+400=800", "5+13=18", "2750+3100=5850", "9+7=16",
                "33+33=66", "41+1500=1541"]


def test_accumulation_weights_micro_batches_by_their_targets(tmp_path):
    start = save_start_model(tmp_path / "start")
    data = write_texts(tmp_path / "docs.jsonl", MIXED_LENGTH)
    accumulated = _run(tmp_path, start, data, "accum", batch_size=2, accum=2)
    whole = _run(tmp_path, start, data, "whole", batch_size=4, accum=1)
    for a, w in zip(accumulated, whole, strict=True):
        assert a["tokens"] == w["tokens"]
        for name in ("loss", "grad_norm"):
            assert a[name] == pytest.approx(w[name], rel=1e-5), (a["step"], name)
    # Adam divides by sqrt(v): reduction-order noise in tiny gradient entries moves weights
    # of magnitude ~0.07 by up to ~3e-6 after 4 steps. (Weighting micro-batches equally
    # instead makes the loss itself differ by ~1e-3 relative.)
    ours, theirs = checkpoint_weights(tmp_path / "accum", 4), checkpoint_weights(tmp_path / "whole", 4)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-5, msg=name)
    # the counts really differed between the two micro-batches of a step
    assert len({len(t) for t in MIXED_LENGTH}) > 4


def test_keep_last_keeps_only_the_newest_checkpoints(tmp_path):
    start = save_start_model(tmp_path / "start")
    config = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                             max_steps=5, save_every=1, keep_last=2)
    config["data"]["batch_size"] = 2
    run(tmp_path, config)
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step_4", "step_5"]
    # what is kept is whole: each loads as a model and holds the training state
    for name in checkpoints:
        files = {p.name for p in (tmp_path / "run" / "checkpoints" / name).iterdir()}
        assert {"model.safetensors", "config.json", "tokenizer.json"} <= files, files
