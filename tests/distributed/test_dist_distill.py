"""distill on 2 processes equals the 1-process run: the teacher sharded like a reference,
the loss computed inside both models' sharded forwards (their chunked heads), on-policy
rows sampled by the rank that holds them with the seeds of the 1-process run."""

from __future__ import annotations

import json
import random

import pytest

from astrai_core.testing import read_metrics, tiny_run_config
from tests.distributed.conftest import (adapter, assert_close_metrics, assert_close_weights, ok,
                                        train, weights)
from tests.training.reference import save_start_model

pytest.importorskip("astrai_plugin_distill")
pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 3


def _chats(path, count=16):
    rng = random.Random(3)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(10), rng.randrange(10)
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{a}+{b}="},
                                             {"role": "assistant", "content": str(a + b)}]})
                    + "\n")
    return path


@pytest.mark.parametrize("strategy,lora", [
    ({"loss": "jsd", "beta": 0.3, "on_policy_fraction": 0.5}, False),
    ({"loss": "forward_kl", "top_k": 8, "on_policy_fraction": 0.0,
      "loss_aggregation": "seq-mean-token-mean"}, False),
    ({"loss": "reverse_kl", "on_policy_fraction": 0.5}, True),
    ({"loss": "forward_kl", "on_policy_fraction": 0.5, "sft_coef": 1.0,
      "teacher_correct_only": True}, False),
])
def test_two_processes_equal_one(tmp_path, strategy, lora):
    teacher = save_start_model(tmp_path / "teacher", seed=5)
    student = save_start_model(tmp_path / "student", seed=0) if lora else None
    chats = _chats(tmp_path / "chats.jsonl")
    metrics = {}
    for name, nproc in (("one", 1), ("two", 2)):
        config = tiny_run_config(tmp_path, chats, {"name": "distill", "teacher": str(teacher),
                                                   **strategy},
                                 data_format="chat", data={"batch_size": 4, "pack": False},
                                 rewards=[], max_steps=STEPS, save_every=1, lr=2e-3, eps=1e-6)
        config["output_dir"] = str(tmp_path / name)
        if lora:  # a LoRA student from a checkpoint: only its adapter trains
            config["model"] = {"path": str(student), "lora": {"r": 4, "alpha": 8.0}}
        config["parallel"] = {"timeout_seconds": 120}
        ok(train(config, tmp_path, name, nproc))
        metrics[name] = read_metrics(tmp_path / name)
    names = ("loss", "distill_loss", "grad_norm", "tokens")
    if strategy["on_policy_fraction"]:
        names += ("distill/on_policy_rows",)
    assert_close_metrics(metrics["one"], metrics["two"], names, rtol=1e-4)
    if lora:
        assert_close_weights(adapter(tmp_path / "one", STEPS), adapter(tmp_path / "two", STEPS))
    else:
        assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "two", STEPS))
