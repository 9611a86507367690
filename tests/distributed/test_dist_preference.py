"""Preference strategies on 2 processes (FSDP2 over gloo) against 1: orpo and SimPO (no
reference model) take the same steps; kto's first step too (its KL reference point pairs
rows within each process's share of the batch, so later steps may differ slightly)."""

from __future__ import annotations

import json
import random

import pytest

from astrai_core.testing import read_metrics, tiny_run_config
from tests.distributed.conftest import (assert_close_metrics, assert_close_weights, ok, train,
                                        weights)

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


def _write_rows(path, unpaired: bool):
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(16):
            a, b = rng.randrange(20), rng.randrange(10)
            wrong = str(a + b + 1 + rng.randrange(9))
            row = ({"prompt": f"{a}+{b}=", "completion": str(a + b) if i % 2 else wrong,
                    "label": bool(i % 2)} if unpaired else
                   {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": wrong})
            f.write(json.dumps(row) + "\n")
    return path


def _one_and_two(tmp_path, strategy, data_format):
    data = _write_rows(tmp_path / "rows.jsonl", data_format == "unpaired")
    runs = {}
    for name, nproc in (("one", 1), ("two", 2)):
        config = tiny_run_config(tmp_path, data, strategy, data_format=data_format,
                                 max_steps=STEPS, save_every=STEPS, lr=1e-2)
        config["output_dir"] = str(tmp_path / name)
        config["data"]["batch_size"] = 8
        ok(train(config, tmp_path, name, nproc))
        runs[name] = tmp_path / name
    return runs


@pytest.mark.parametrize("strategy", [{"name": "orpo", "beta": 0.5},
                                      {"name": "dpo", "loss_type": "simpo", "beta": 2.0}])
def test_reference_free_losses_on_two_processes_equal_one(tmp_path, strategy):
    runs = _one_and_two(tmp_path, strategy, "preference")
    one, two = read_metrics(runs["one"]), read_metrics(runs["two"])
    assert len(two) == STEPS
    assert_close_metrics(one, two, ("loss", "grad_norm", "margin"))
    assert_close_weights(weights(runs["one"], STEPS), weights(runs["two"], STEPS))


def test_kto_first_step_on_two_processes_equals_one(tmp_path):
    # at step 1 the policy is the reference: every r and the KL estimate are 0 on any
    # number of processes, so the first gradient is the same
    runs = _one_and_two(tmp_path, {"name": "kto", "beta": 0.5}, "unpaired")
    one, two = read_metrics(runs["one"]), read_metrics(runs["two"])
    assert len(two) == STEPS
    assert_close_metrics(one[:1], two[:1], ("loss", "grad_norm", "kl"))
    assert one[0]["kl"] == 0.0
