"""Resume is exact: kill a run right after a checkpoint, resume it, and end bit-identical
to an uninterrupted run of the same config, with every step logged exactly once.

The kill is deterministic: the test kit's fault driver (astrai_core.testing.faults) runs
`astrai train` with a phase hook that SIGKILLs the run the moment the chosen checkpoint is
renamed into place.
"""

from __future__ import annotations

import subprocess

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.testing import read_metrics
from astrai_core.testing.faults import killed_command
from astrai_core.training.phases import CHECKPOINT_SAVED
from tests.training.conftest import astrai, tiny_config, write_config
from tests.training.reference import (load_model, mean_cross_entropy, save_start_model,
                                      text_documents, text_run_config, write_texts)


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors"))


def killed_after_checkpoint(step: int, *args: str):
    """`astrai train ARGS`, SIGKILLed by itself right after checkpoint ``step`` is in place."""
    return subprocess.run([*killed_command(CHECKPOINT_SAVED, step), *args],
                          capture_output=True, text=True, timeout=600)


STEPS = 12
TIMING = ("time/step_seconds", "throughput/tokens_per_s")


def _without_timing(record):
    return {k: v for k, v in record.items() if k not in TIMING}


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """(reference run dir, run dir killed right after step_8 and resumed)."""
    tmp_path = tmp_path_factory.mktemp("resume")
    reference_cfg = tiny_config(tmp_path, max_steps=STEPS)
    reference_cfg["output_dir"] = str(tmp_path / "reference")
    reference = astrai("train", str(write_config(tmp_path, reference_cfg, "reference.yaml")))
    assert reference.returncode == 0, reference.stderr

    interrupted_cfg = dict(reference_cfg, output_dir=str(tmp_path / "interrupted"))
    config_path = write_config(tmp_path, interrupted_cfg, "interrupted.yaml")
    run_dir = tmp_path / "interrupted"
    killed = killed_after_checkpoint(8, "train", str(config_path))
    assert killed.returncode == -9, killed.stderr[-2000:]  # died by SIGKILL, not by an error
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_4", "step_8"]

    resumed = astrai("train", str(config_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    return tmp_path / "reference", run_dir


def test_killed_and_resumed_run_equals_uninterrupted_run(killed_and_resumed):
    reference_dir, run_dir = killed_and_resumed
    expected, got = _weights(reference_dir, STEPS), _weights(run_dir, STEPS)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after resume"
    reference = {r["step"]: _without_timing(r) for r in read_metrics(reference_dir)}
    records = read_metrics(run_dir)
    assert len(records) >= STEPS - 1
    for record in records:  # every logged metric of every step is bit-identical
        assert _without_timing(record) == reference[record["step"]], record["step"]


def test_every_step_is_logged_exactly_once_after_a_kill_right_after_a_checkpoint(
        killed_and_resumed):
    _, run_dir = killed_and_resumed
    logged = [record["step"] for record in read_metrics(run_dir)]
    assert logged == list(range(1, STEPS + 1)), logged


def test_checkpoint_is_the_trained_model_with_its_tokenizer(tmp_path):
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.testing import ARITH_TOKENIZER

    start = save_start_model(tmp_path / "start")
    held_out = ["3+4=7", "250+250=500"]
    config = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start, max_steps=4)
    config["data"]["eval"] = {"path": str(write_texts(tmp_path / "eval.jsonl", held_out)),
                              "format": "text"}
    result = astrai("train", str(write_config(tmp_path, config)))
    assert result.returncode == 0, result.stderr

    checkpoint = tmp_path / "run" / "checkpoints" / "step_4"
    tokenizer = load_tokenizer(checkpoint)
    source_tokenizer = load_tokenizer(ARITH_TOKENIZER)
    for text in ("12+3=", "<|end|>", "999+1=1000"):
        assert tokenizer.encode(text) == source_tokenizer.encode(text)
    model = load_pretrained(checkpoint)
    # The loaded weights are the ones the run evaluated at its last step: the eval/loss the
    # training process logged from its live model is reproduced from the files alone.
    [last] = [r for r in read_metrics(tmp_path / "run") if r["step"] == 4]
    assert mean_cross_entropy(model, text_documents(held_out)).item() == pytest.approx(
        last["eval/loss"], rel=1e-5)
    assert mean_cross_entropy(load_model(start), text_documents(held_out)).item() != \
        pytest.approx(last["eval/loss"], rel=1e-3)  # and they are not the starting weights
    # no staging directories are left behind
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step_4"]
