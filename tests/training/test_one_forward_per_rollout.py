"""One step per rollout (epochs x mini_batches = 1): the training forward stands in for
the per-rollout no-grad forward (old log-probs with recompute, the mismatch metrics, and
rollout correction's weights and metrics, micro-batch by micro-batch).

The reference is the same run with that no-grad forward kept (``defers_old_logprobs``
switched off on the strategy): weights and metrics must agree.
"""

from __future__ import annotations

import pytest
import torch

from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.training.online import OnlineConfig
from astrai_core.training.online_logprobs import may_defer
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
    assert calls.count("no-grad") == 0 and ref_calls.count("no-grad") == 3
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
    assert may_defer(config, capable=True, recompute=True) is deferred
    assert not may_defer(config, capable=False, recompute=True)
