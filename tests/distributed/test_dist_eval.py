"""Evaluation split over the ranks equals the 1-process evaluation: the held-out loss
(each rank scores every other batch; an odd number of batches leaves one rank a round
with none, where it runs a discarded forward to stay in step) and the accuracy by
generation (each rank generates for every other prompt; an odd number of prompts gives
unequal shares). At step 0 the weights are the same, so the numbers agree to summation
order; after a step within the runs' float tolerance."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
from tests.distributed.conftest import ok, train
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun

# Loaded by every process through ASTRAI_PLUGINS: it notes, per rank, the rows each
# no-grad (evaluation) loss covers and the held-out prompts each rank scores, so the
# test sees that the work was split and not done whole on every rank.
PLUGIN = '''
import os
import torch
from astrai_core import RewardFunctionSpec, hookimpl
import astrai_core.strategies.language_modeling as _lm


@hookimpl
def astrai_reward_functions():
    return [RewardFunctionSpec(name="noted", target="eval_note_plugin:noted",
                               summary="1 for every completion; notes held-out prompts")]


def _note(line):
    with open(os.path.join(os.environ["EVAL_LOG"], "rank" + os.environ.get("RANK", "0")), "a") as f:
        f.write(line + "\\n")


_next_token_loss = _lm.next_token_loss


def _noting_next_token_loss(logprobs, loss_mask):
    if not torch.is_grad_enabled():
        _note("rows %d" % loss_mask.shape[0])
    return _next_token_loss(logprobs, loss_mask)


_lm.next_token_loss = _noting_next_token_loss


def noted(prompts, completions, **columns):
    for prompt, split in zip(prompts, columns.get("split", [None] * len(prompts))):
        if split == "held_out":
            _note("prompt " + prompt.replace("\\n", " "))
    return [1.0] * len(completions)
'''


@pytest.fixture
def plugin_env(tmp_path) -> dict[str, str]:
    directory = tmp_path / "plugin"
    directory.mkdir()
    (directory / "eval_note_plugin.py").write_text(PLUGIN)
    return {"ASTRAI_PLUGINS": "eval_note_plugin",
            "PYTHONPATH": os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")])}


def notes(tmp: Path, run_name: str, rank: int) -> list[str]:
    path = tmp / f"{run_name}_log" / f"rank{rank}"
    return path.read_text().splitlines() if path.exists() else []


def eval_records(tmp: Path, name: str, config: dict, env: dict[str, str]) -> list[list[dict]]:
    """The eval records ({step, eval/...}) of the 1- and 2-process runs of ``config``."""
    runs = []
    for nproc in (1, 2):
        run_name = f"{name}{nproc}"
        (tmp / f"{run_name}_log").mkdir()
        ok(train(dict(config, output_dir=str(tmp / run_name)), tmp, run_name, nproc,
                 env={**env, "EVAL_LOG": str(tmp / f"{run_name}_log")}))
        runs.append([{k: v for k, v in m.items() if k == "step" or k.startswith("eval/")}
                     for m in read_metrics(tmp / run_name) if "eval/loss" in m
                     or "eval/reward" in m])
    return runs


def assert_same(one: list[dict], two: list[dict], first: float, later: float) -> None:
    assert [m["step"] for m in one] == [m["step"] for m in two] == [0, 1]
    for x, y in zip(one, two):
        assert x.keys() == y.keys()
        tolerance = first if x["step"] == 0 else later
        for name in x:
            assert y[name] == pytest.approx(x[name], rel=tolerance, abs=tolerance), name


def test_split_loss_evaluation_equals_one_process(tmp_path, plugin_env):
    config = tiny_config(tmp_path, max_steps=1, warmup_steps=0, save_every=0, eval_every=1,
                         eval_at_start=True, progress=False)
    rows = (tmp_path / "data" / "sft_train.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "held_out.jsonl").write_text("".join(rows[-15:]))
    config["data"]["eval"] = {"path": str(tmp_path / "held_out.jsonl"), "format": "chat"}
    config["data"]["eval_batch_size"] = 1  # 3 packed rows: 3 batches over 2 ranks
    one, two = eval_records(tmp_path, "loss", config, plugin_env)
    assert one[0]["eval/loss"] > 0
    assert_same(one, two, 1e-12, 1e-5)
    # two evaluations: one process scores the 3 batches each time; rank 0 batches 0 and 2,
    # rank 1 batch 1 and, in the second round, batch 0 again (discarded)
    assert notes(tmp_path, "loss1", 0) == ["rows 1"] * 6
    assert notes(tmp_path, "loss2", 0) == notes(tmp_path, "loss2", 1) == ["rows 1"] * 4


def test_split_generation_evaluation_equals_one_process(tmp_path, plugin_env):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    held_out = write_arith_prompts(tmp_path / "held_out.jsonl", count=7,  # shares of 4 and 3
                                   split="held_out")
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2}, max_steps=1,
                             rewards=[{"name": "exact_match"},
                                      {"name": "format_regex", "pattern": "[0-9]"},
                                      {"name": "noted", "weight": 0.0}],
                             eval_every=1, eval_at_start=True, eval_max_new_tokens=4)
    config["data"].update(batch_size=4, eval={"path": str(held_out), "format": "prompt"})
    one, two = eval_records(tmp_path, "gen", config, plugin_env)
    assert {"eval/accuracy", "eval/reward/format_regex", "eval/response_length"} <= set(one[0])
    assert_same(one, two, 1e-12, 1e-12)
    whole = notes(tmp_path, "gen1", 0)
    shares = [notes(tmp_path, "gen2", rank) for rank in (0, 1)]
    assert len(whole) == 14 and [len(share) for share in shares] == [8, 6]  # 2 evaluations
    assert sorted(shares[0] + shares[1]) == sorted(whole)
