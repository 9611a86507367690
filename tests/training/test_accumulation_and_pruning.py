"""grad_accum_steps 2 with batch b equals grad_accum_steps 1 with batch 2b (real runs,
equal up to reduction order), and keep_last prunes to the newest checkpoints that verify."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.manifest import verify_manifest
from astrai_core.config.schema import RunConfig
from astrai_core.errors import CheckpointError
from astrai_core.training.phases import CHECKPOINT_SAVED
from astrai_core.training.run import train
from tests.training.conftest import tiny_config
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


def test_keep_last_counts_only_checkpoints_that_verify(tmp_path):
    # step_2 is corrupted (same size, other bytes) once step_3 is saved: keep_last 2 keeps
    # step_1 then, rather than deleting the last good one before step_3
    config = RunConfig.model_validate(tiny_config(tmp_path, max_steps=4, save_every=1,
                                                  keep_last=2, progress=False))
    root = tmp_path / "run" / "checkpoints"
    seen = {}

    def hook(phase: str, step: int) -> None:
        if phase != CHECKPOINT_SAVED:
            return
        if step == 3:
            weights = root / "step_2" / "model.safetensors"
            data = bytearray(weights.read_bytes())
            data[-64:] = bytes(64)
            weights.write_bytes(bytes(data))
        seen[step] = sorted(p.name for p in root.iterdir())

    train(config, phase_hook=hook)
    # step 3's pruning counted step_3 and step_1; step 4's, step_4 and step_3
    assert seen[4] == ["step_1", "step_2", "step_3", "step_4"]
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_3", "step_4"]
    with pytest.raises(CheckpointError, match="step_2/model.safetensors is corrupt"):
        verify_manifest(root / "step_2", hashes=True)
    for name in ("step_3", "step_4"):
        verify_manifest(root / name, hashes=True)
