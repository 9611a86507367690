"""One step per rollout (epochs x mini_batches = 1): the training forward stands in for
the per-rollout no-grad forward (old log-probs with recompute, the mismatch metrics, and
rollout correction's weights and metrics, micro-batch by micro-batch).

The reference is the same run with that no-grad forward kept (``defers_old_logprobs``
switched off on the strategy): weights and metrics must agree.
"""

from __future__ import annotations

import math

import pytest
import torch

from astrai_core.rl.rollout_correction import RolloutCorrectionConfig
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.config.online import OnlineConfig
from astrai_core.online.deferred import DeferredOldLogprobs, may_defer
from astrai_core.online.mismatch import rollout_mismatch
from astrai_core.online.routing import RouterReplay
from astrai_core.training.push_check import METRIC
from astrai_core.training.trainer import Trainer

TIMING = ("time/", "throughput/")


def _fit(tmp_path, name: str, strategy: dict, defer: bool, sampler: dict | None = None,
         **trainer):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, strategy, data={"batch_size": 4},
                             sampler={"temperature": 0.8, **(sampler or {})}, max_steps=3,
                             **trainer)
    config["output_dir"] = str(tmp_path / name)
    strategy, run = build_strategy(config, tmp_path)
    strategy.defers_old_logprobs = defer
    calls = []
    forward = run.model.forward
    # what each forward of the policy is: "train" (grad), "sample" (inference mode: the
    # sampler) or "no-grad" (the per-rollout forward this optimisation removes)
    run.model.forward = lambda *a, **k: calls.append(  # noqa: E731
        "train" if torch.is_grad_enabled() else
        "sample" if torch.is_inference_mode_enabled() else "no-grad") or forward(*a, **k)
    Trainer(run, strategy).fit()
    metrics = [{k: v for k, v in m.items() if not k.startswith(TIMING)}
               for m in read_metrics(tmp_path / name) if "loss" in m]
    return run.model.state_dict(), metrics, calls


@pytest.mark.parametrize("strategy", [
    {"name": "grpo", "group_size": 2},
    {"name": "grpo", "group_size": 2, "recompute_old_logprobs": True},
    {"name": "ppo", "group_size": 2, "critic_lr": 1e-3, "epochs": 1, "mini_batches": 1},
], ids=["grpo, sampler log-probs", "grpo, recomputed", "ppo"])
def test_the_training_forward_replaces_the_no_grad_forward(tmp_path, strategy):
    weights, metrics, calls = _fit(tmp_path, "one", strategy, defer=True)
    ref_weights, ref_metrics, ref_calls = _fit(tmp_path, "two", strategy, defer=False)
    assert calls.count("train") == ref_calls.count("train") == 3
    assert calls.count("sample") == ref_calls.count("sample")
    assert calls.count("no-grad") == 0 and ref_calls.count("no-grad") == 3
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6, msg=key)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for got, want in zip(metrics, ref_metrics, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
        assert got["ratio_max"] == pytest.approx(1.0, abs=1e-6)
        assert "rollout/logprob_diff_max" in got


# A sampler misreporting its log-probs by -+0.4 on every other row's tokens: weights of
# exp(+-0.4) per token, of exp(0.4 / L) for a response of odd length L, and 1 elsewhere.
# The thresholds keep every unit well away from them, and cut or mask some.
CORRECTIONS = {
    "token truncate": {"level": "token", "mode": "truncate", "threshold": 1.2},
    "token mask": {"level": "token", "mode": "mask", "threshold": 1.1},
    "sequence truncate": {"level": "sequence", "mode": "truncate", "threshold": 1.02},
    "sequence mask": {"level": "sequence", "mode": "mask", "threshold": 1.1},
}
PERTURBED = {"name": "perturbed", "every_other_row": True, "sign": -1, "max_new_tokens": 3,
             "stop_token_ids": list(range(8, 24))}  # lengths 1 to 3


PADDED, PACKED = {"grad_accum_steps": 2}, {"micro_batch_tokens": 24}
CASES = [pytest.param("grpo", correction, trainer, id=f"grpo {correction} {layout}")
         for correction in sorted(CORRECTIONS)
         for layout, trainer in (("padded", PADDED), ("packed", PACKED))]
CASES.append(pytest.param("ppo", "token truncate", PACKED, id="ppo token truncate packed"))


@pytest.mark.parametrize(("name", "correction", "trainer"), CASES)
def test_rollout_correction_is_computed_on_each_micro_batch(tmp_path, perturbed_sampler,
                                                            name, correction, trainer):
    strategy = {"name": name, "group_size": 2, "rollout_correction": CORRECTIONS[correction],
                "epochs": 1, "mini_batches": 1}  # ppo's default is more steps per rollout
    weights, metrics, calls = _fit(tmp_path, "one", strategy, True, PERTURBED, **trainer)
    ref_weights, ref_metrics, ref_calls = _fit(tmp_path, "two", strategy, False, PERTURBED,
                                               **trainer)
    assert calls.count("train") == ref_calls.count("train") > 3  # micro-batches: 2 or more
    # one no-grad forward per rollout, or packed: one per micro-batch (the same rows)
    no_grad = ref_calls.count("train") if trainer is PACKED else 3
    assert calls.count("no-grad") == 0 and ref_calls.count("no-grad") == no_grad
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-5, msg=key)
    cut = "rollout_correction/" + ("truncated_fraction" if "truncate" in correction
                                   else "masked_fraction")
    assert any(m[cut] > 0 for m in ref_metrics)  # weights that matter ...
    assert any(m["grad_norm"] > 0 for m in ref_metrics)  # ... on a loss that trains
    for got, want in zip(metrics, ref_metrics, strict=True):
        assert got.keys() == want.keys()
        assert {"rollout_correction/weight_mean", "rollout_correction/weight_max",
                "rollout_correction/kl", cut} <= want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-5), key


@pytest.mark.parametrize(("options", "deferred"), [
    ({}, True),
    ({"router_replay": "R3"}, True),  # the sampler's routing: no forward records it
    ({"mini_batches": 2}, False),  # the old policy is the one before the first step
    ({"epochs": 2}, False),
    ({"router_replay": "R2"}, False),  # the no-grad forward records the routing to replay
    ({"kl_in_reward_coef": 0.1}, False),  # the shaping reads the old log-probs
])
def test_which_runs_with_rollout_correction_keep_the_no_grad_forward(options, deferred):
    config = OnlineConfig(rollout_correction={"level": "token"}, **options)
    routing = RouterReplay(config.router_replay)
    assert may_defer(config, capable=True, recompute=True, routing=routing) is deferred
    assert not may_defer(config, capable=False, recompute=True, routing=routing)


def _micro_batch(sampler: list[list[float]], mask: list[list[bool]]) -> RolloutBatch:
    rows, width = len(sampler), len(sampler[0])
    return RolloutBatch(
        prompt_ids=torch.zeros(rows, 1, dtype=torch.long),
        prompt_mask=torch.ones(rows, 1, dtype=torch.bool),
        response_ids=torch.zeros(rows, width, dtype=torch.long),
        response_mask=torch.tensor(mask), old_logprobs=torch.tensor(sampler),
        rewards=torch.zeros(rows), reward_components={}, group_ids=torch.arange(rows))


def test_the_step_metrics_combine_micro_batches_and_keep_a_nan():
    """Means over all the step's units (not a mean of the micro-batches' means), maxima
    over all; a NaN log-prob stays NaN, so that rollout.max_logprob_diff stops the run."""
    correction = RolloutCorrectionConfig(level="sequence", mode="mask", threshold=1.5)
    deferred = DeferredOldLogprobs()
    deferred.start(recompute=True, measure=True, prefix="rollout/", correction=correction)
    first = _micro_batch([[-1.0, -1.0], [-2.0, -2.0]], [[True, True], [True, False]])
    second = _micro_batch([[-1.0, -3.0]], [[True, True]])
    trainer = [torch.tensor([[-0.5, -1.5], [-1.0, 9.0]]), torch.tensor([[-1.0, -3.0]])]
    for batch, logprobs in zip((first, second), trainer):
        old = deferred.old_logprobs_for(batch, logprobs, training=True)
        torch.testing.assert_close(old, torch.where(batch.response_mask, logprobs, 0.0))
    # sequences: log-weights (0.5 - 0.5) / 2 = 0, then 1.0 (one token), then 0
    torch.testing.assert_close(first.extras["rollout_weights"],
                               torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # e > 1.5: masked
    torch.testing.assert_close(second.extras["rollout_weights"], torch.ones(1, 2))
    metrics = deferred.pop_metrics()
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx((0.5 + 0.5 + 1.0) / 5)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(1.0)
    assert metrics["rollout_correction/weight_mean"] == pytest.approx((1 + math.e + 1) / 3)
    assert metrics["rollout_correction/weight_max"] == pytest.approx(math.e)
    assert metrics["rollout_correction/masked_fraction"] == pytest.approx(1 / 3)
    k3 = lambda g: math.exp(g) - 1 - g  # noqa: E731
    assert metrics["rollout_correction/kl"] == pytest.approx(
        (k3(0.5) + k3(-0.5) + k3(1.0)) / 5)
    deferred.old_logprobs_for(second, torch.tensor([[float("nan"), -3.0]]), training=True)
    assert math.isnan(deferred.pop_metrics()["rollout/logprob_diff_max"])


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_whole_rollout_and_its_micro_batches_measure_alike(level):
    """The no-grad forward measures the whole rollout, the training forwards its
    micro-batches: the same weights, and the same metrics once added up, under the key
    rollout.max_logprob_diff reads."""
    generator = torch.Generator().manual_seed(0)
    sampler = -torch.rand(4, 5, generator=generator) * 3
    trainer = sampler + torch.randn(4, 5, generator=generator) * 0.3
    mask = torch.rand(4, 5, generator=generator) > 0.3
    mask[2] = False  # a row without a token
    correction = RolloutCorrectionConfig(level=level, mode="truncate", threshold=1.2)
    weights, whole = rollout_mismatch(trainer, sampler, mask, correction)
    deferred = DeferredOldLogprobs()
    deferred.start(recompute=True, measure=True, prefix="rollout/", correction=correction)
    parts = []
    for rows in (slice(0, 1), slice(1, 4)):
        batch = _micro_batch(sampler[rows].tolist(), mask[rows].tolist())
        deferred.old_logprobs_for(batch, trainer[rows], training=True)
        parts.append(batch.extras["rollout_weights"])
    torch.testing.assert_close(torch.cat(parts), weights, rtol=0, atol=0)
    split = deferred.pop_metrics()
    assert METRIC in whole and split.keys() == whole.keys()
    assert whole[METRIC] == (trainer - sampler).abs()[mask].max().item()
    for key, value in whole.items():
        assert split[key] == pytest.approx(value, rel=1e-6), key
