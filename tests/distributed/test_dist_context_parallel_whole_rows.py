"""parallel.context_parallel for the strategies whose loss is a function of whole rows
(dpo offline and online, simpo, kto, orpo, rm, distill): each rank of a context group of 2 runs its half of
every row's tokens and gets the whole rows' log-probs, rewards or token losses; 2 steps
on 2 processes equal the 1-process run. Rows are long (20 to 45 tokens) and of uneven
lengths, so that responses straddle the shard boundary and the rows are padded to an
even width."""

from __future__ import annotations

import json
import random

import pytest

from astrai_core.testing import read_metrics, tiny_run_config
from tests.distributed.conftest import (assert_close_metrics, assert_close_weights, ok, train,
                                        weights)
from tests.distributed.test_dist_context_parallel import _split
from tests.distributed.test_dist_online import online_config, plugin_env  # noqa: F401
from tests.training.reference import save_start_model

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 2


def _sums(path, kind: str):
    """16 rows of long sums (4 to 9 terms), in ``kind``'s format: preference, unpaired or
    chat."""
    rng = random.Random(7)
    with path.open("w") as f:
        for i in range(16):
            terms = [rng.randrange(100) for _ in range(rng.randrange(4, 10))]
            prompt, right = "+".join(map(str, terms)) + "=", str(sum(terms))
            wrong = str(sum(terms) + 1 + rng.randrange(90))
            row = ({"prompt": prompt, "chosen": right, "rejected": wrong} if kind == "preference"
                   else {"prompt": prompt, "completion": right if i % 2 else wrong,
                         "label": bool(i % 2)} if kind == "unpaired"
                   else {"messages": [{"role": "user", "content": prompt},
                                      {"role": "assistant", "content": right}]})
            f.write(json.dumps(row) + "\n")
    return path


def _one_and_split(tmp_path, strategy: dict, kind: str, eps: float = 1e-6,
                   evaluate: bool = False) -> tuple[list[dict], list[dict]]:
    """The 1-process run and the run on one context group of 2 processes (which must
    split its rows): their records (``evaluate``: the held-out loss after the last step,
    on the same rows in batches of 4)."""
    data = _sums(tmp_path / "rows.jsonl", kind)
    for name, nproc in (("one", 1), ("cp", 2)):
        config = tiny_run_config(tmp_path, data, strategy, data_format=kind,
                                 data={"batch_size": 4, "pack": False}, max_steps=STEPS,
                                 save_every=STEPS, lr=1e-2, eps=eps)
        config.pop("rewards"), config.pop("sampler")  # offline: neither is built
        if evaluate:
            config["data"].update(eval={"path": str(data), "format": kind}, eval_batch_size=4)
            config["trainer"]["eval_every"] = STEPS
        config["output_dir"] = str(tmp_path / name)
        config["parallel"] = {"context_parallel": 2, "timeout_seconds": 120}
        done = train(config, tmp_path, name, nproc)
        if nproc == 1:
            ok(done)
        else:
            _split(done)
    one, cp = (read_metrics(tmp_path / run) for run in ("one", "cp"))
    assert len([r for r in cp if "loss" in r]) == STEPS
    return one, cp


@pytest.mark.parametrize("strategy, kind, names", [
    ({"name": "dpo", "beta": 0.5}, "preference", ("chosen_logp", "margin")),
    ({"name": "dpo", "loss_type": "simpo", "beta": 2.0}, "preference", ("chosen_logp", "margin")),
    ({"name": "orpo", "beta": 0.5}, "preference", ("nll", "odds_ratio_loss")),
    ({"name": "kto", "beta": 0.5}, "unpaired", ("logp", "kl")),
], ids=["dpo", "simpo", "orpo", "kto"])
def test_preference_pairs_split_over_a_context_group_equal_one_process(tmp_path, strategy,
                                                                       kind, names):
    one, cp = _one_and_split(tmp_path, strategy, kind)
    assert_close_metrics(one, cp, ("loss", "grad_norm", "tokens", *names))
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "cp", STEPS))


def test_online_pairs_split_over_a_context_group_equal_one_process(tmp_path, plugin_env):
    """Online dpo: the group pairs its gathered rollout (responses of up to 13 tokens
    after short chat prompts: many straddle the shard boundary)."""
    for name, nproc in (("one", 1), ("cp", 2)):
        config = online_config(tmp_path, name, {"name": "dpo", "mode": "online",
                                                "group_size": 4, "beta": 0.5})
        config["sampler"]["max_new_tokens"] = 13
        config["trainer"]["max_steps"] = STEPS
        config["parallel"]["context_parallel"] = 2
        done = train(config, tmp_path, name, nproc, env=plugin_env)
        if nproc == 1:
            ok(done)
        else:
            _split(done)
    one, cp = (read_metrics(tmp_path / run) for run in ("one", "cp"))
    assert len(cp) == STEPS
    assert_close_metrics(one, cp, ("loss", "grad_norm", "tokens", "chosen_logp", "margin",
                                   "rollout/pairs"))
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "cp", STEPS))


def test_reward_model_split_over_a_context_group_equals_one_process(tmp_path):
    strategy = {"name": "rm", "center_rewards_coefficient": 0.1}
    # Adam's eps above the smallest gradients (a reward reads one position per row): their
    # float32 rounding is not amplified into lr-sized updates
    one, cp = _one_and_split(tmp_path, strategy, "preference", eps=1e-4, evaluate=True)
    steps = [[r for r in run if "loss" in r] for run in (one, cp)]
    assert_close_metrics(*steps, ("loss", "grad_norm", "tokens", "chosen_reward", "reward_gap"))
    evals = [[r for r in run if "eval/accuracy" in r] for run in (one, cp)]
    assert len(evals[0]) == len(evals[1]) == 1
    assert_close_metrics(*evals, ("eval/loss", "eval/accuracy"))
    for module in ("model", "score"):
        assert_close_weights(weights(tmp_path / "one", STEPS, module),
                             weights(tmp_path / "cp", STEPS, module))


@pytest.mark.parametrize("strategy", [
    {"loss": "jsd", "beta": 0.3},
    {"loss": "forward_kl", "sft_coef": 1.0, "teacher_correct_only": True,
     "loss_aggregation": "seq-mean-token-mean"},
], ids=["jsd", "forward-kl-sft"])
def test_distill_split_over_a_context_group_equals_one_process(tmp_path, strategy):
    teacher = save_start_model(tmp_path / "teacher", seed=5)
    strategy = {"name": "distill", "teacher": str(teacher), "on_policy_fraction": 0.0,
                **strategy}
    one, cp = _one_and_split(tmp_path, strategy, "chat")
    assert_close_metrics(one, cp, ("loss", "distill_loss", "grad_norm", "tokens"))
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "cp", STEPS))
