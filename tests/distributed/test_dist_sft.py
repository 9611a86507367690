"""SFT on 2 processes (FSDP2 over gloo) equals SFT on 1, and its checkpoints resume
exactly: after a SIGKILL on the same world size (bit for bit), and across world sizes
(2 -> 1, 1 -> 2; within reduction-order tolerance)."""

from __future__ import annotations

import json

import pytest

from astrai_core.checkpoints.native import load_pretrained
from astrai_core.testing import read_metrics
from astrai_core.testing.faults import killed_command
from astrai_core.training.phases import CHECKPOINT_SAVED
from tests.distributed.conftest import (assert_close_metrics, assert_close_weights,
                                        copy_checkpoint, ok, train, weights, without_timing)
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 10
LOSSES = ("loss", "lm_loss", "grad_norm", "tokens")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: run dir} of the SFT runs every test here compares."""
    tmp = tmp_path_factory.mktemp("dist_sft")
    base = tiny_config(tmp, max_steps=STEPS, warmup_steps=2, save_every=4, progress=False)

    def config(name: str) -> dict:
        return dict(base, output_dir=str(tmp / name))

    ok(train(config("one"), tmp, "one"))
    ok(train(config("two"), tmp, "two", 2))
    killed = train(config("killed"), tmp, "killed", 2, 
                   command=killed_command(CHECKPOINT_SAVED, 8))
    assert killed.returncode != 0 and "signal 9" in killed.stderr, killed.stderr[-3000:]
    assert sorted(p.name for p in (tmp / "killed" / "checkpoints").iterdir()) == \
        ["step_4", "step_8"]
    ok(train(config("killed"), tmp, "killed", 2, "--resume"))
    for source, target in (("two", "two_to_one"), ("one", "one_to_two")):
        copy_checkpoint(tmp / source, tmp / target, 4)
    ok(train(config("two_to_one"), tmp, "two_to_one", 1, "--resume"))
    ok(train(config("one_to_two"), tmp, "one_to_two", 2, "--resume"))
    return {name: tmp / name for name in
            ("one", "two", "killed", "two_to_one", "one_to_two")}


def test_two_processes_equal_one(runs):
    one, two = read_metrics(runs["one"]), read_metrics(runs["two"])
    assert len(two) == STEPS
    assert_close_metrics(one, two, LOSSES)
    assert_close_weights(weights(runs["one"], STEPS), weights(runs["two"], STEPS))


def test_checkpoint_is_one_loadable_model(runs):
    """model.safetensors is the whole model (rank 0 consolidates), beside the shards."""
    checkpoint = runs["two"] / "checkpoints" / f"step_{STEPS}"
    model = load_pretrained(checkpoint)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert (checkpoint / "dcp" / ".metadata").is_file()
    assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == \
        ["__0_0.distcp", "__1_0.distcp"]  # one shard file per rank
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == STEPS


def test_sigkill_then_resume_is_bit_identical(runs):
    reference, resumed = read_metrics(runs["two"]), read_metrics(runs["killed"])
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))  # each step once
    assert [without_timing(r) for r in resumed] == [without_timing(r) for r in reference]
    for name, tensor in weights(runs["two"], STEPS).items():
        assert tensor.equal(weights(runs["killed"], STEPS)[name]), name


@pytest.mark.parametrize("resumed, reference", [("two_to_one", "two"), ("one_to_two", "one")])
def test_resume_on_another_world_size(runs, resumed, reference):
    ran, expected = read_metrics(runs[resumed]), read_metrics(runs[reference])
    assert [r["step"] for r in ran] == list(range(1, STEPS + 1))
    assert_close_metrics(expected, ran, LOSSES)
    assert_close_weights(weights(runs[reference], STEPS), weights(runs[resumed], STEPS))
