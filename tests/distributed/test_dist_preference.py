"""Preference strategies on 2 processes (FSDP2 over gloo) against 1: orpo, SimPO and kto
take the same steps (kto's KL reference point pairs rows and averages over the global
batch, so it is the same on any number of processes)."""

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


def _one_and_two(tmp_path, strategy, data_format, steps=STEPS):
    data = _write_rows(tmp_path / "rows.jsonl", data_format == "unpaired")
    runs = {}
    for name, nproc in (("one", 1), ("two", 2)):
        config = tiny_run_config(tmp_path, data, strategy, data_format=data_format,
                                 max_steps=steps, save_every=steps, lr=1e-2)
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


def test_kto_on_two_processes_equals_one(tmp_path):
    # at step 1 the policy is the reference (z0 = 0); at steps 2 and 4 z0 > 0 comes from rows
    # paired across the two processes' shares and averaged over both
    runs = _one_and_two(tmp_path, {"name": "kto", "beta": 0.5}, "unpaired", steps=4)
    one, two = read_metrics(runs["one"]), read_metrics(runs["two"])
    assert len(two) == 4
    assert one[0]["kl"] == 0.0 and one[1]["kl"] > 0.1 and one[3]["kl"] > 0.1
    assert_close_metrics(one, two, ("loss", "grad_norm", "kl"))
    assert_close_weights(weights(runs["one"], 4), weights(runs["two"], 4))
