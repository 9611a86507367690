"""rollout.partial on a real GRPO run with the torch sampler: a weight update lands between
two rollout steps while sequences are in flight; each token's behaviour log-prob is the
log-prob of the weights its recorded version names, and the loss is the decoupled
objective (behaviour log-probs in the importance weight, the proximal policy in the
clipped ratio), computed here by hand."""

from __future__ import annotations

import copy

import pytest
import torch

from astrai_core.errors import ConfigError
from astrai_core.rollout.forward import policy_forward
from astrai_core.testing import build_strategy, tiny_run_config, write_arith_prompts

STOPS = list(range(8, 24))  # a third of the vocabulary ends a completion: lengths vary


def _config(tmp_path, **rollout):
    config = tiny_run_config(
        tmp_path, write_arith_prompts(tmp_path / "prompts.jsonl"),
        {"name": "grpo", "group_size": 4,
         "rollout_correction": {"level": "token", "mode": "truncate", "threshold": 100.0}},
        sampler={"max_new_tokens": 8, "stop_token_ids": STOPS})
    config["data"]["batch_size"] = 2
    config["rollout"] = {"partial": True, "max_staleness": 1, "partial_tokens": 2, **rollout}
    return config


def _perturb(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize("keep", [False, True], ids=["recomputed", "kept caches"])
@pytest.mark.parametrize("epochs", [2, 1], ids=["proximal forward", "deferred"])
def test_versions_behaviour_logprobs_and_the_decoupled_loss(tmp_path, epochs, keep):
    """With two epochs the proximal policy is the one of the rollout's no-grad forward, and
    a later optimizer step trains on it; with one step per rollout it is the policy being
    trained, whose training forward stands in for the no-grad one. With the sampler's
    ``keep_unfinished`` the segments of one draw continue from the caches the previous
    segment left, and those of the next draw, under new weights, do not."""
    config = _config(tmp_path)
    config["strategy"]["epochs"] = epochs
    config["sampler"]["keep_unfinished"] = keep
    strategy, run = build_strategy(config, tmp_path)
    drawer = strategy.batch_source().drawer
    model = run.model
    first_weights = copy.deepcopy(model)
    drawer.draw()                                   # version 0; some groups are carried
    assert drawer.groups and any(s.tokens for g in drawer.groups for s in g.sequences)
    _perturb(model, 1)                               # the optimizer step, scripted
    assert run.rollouts.publish_from(model) == 1
    second_weights = copy.deepcopy(model)
    rollout = drawer.draw()                          # carried sequences continue at version 1
    mask, versions = rollout.response_mask, rollout.token_versions
    old, new = (versions == 0) & mask, (versions == 1) & mask
    assert old.any() and new.any() and rollout.context_mask is None  # k = 1: none masked
    behaviour = rollout.old_logprobs.clone()
    with torch.no_grad():
        under_first = policy_forward(first_weights, rollout)["logprobs"]
        under_second = policy_forward(second_weights, rollout)["logprobs"]
    torch.testing.assert_close(behaviour[old], under_first[old], atol=1e-5, rtol=0)
    torch.testing.assert_close(behaviour[new], under_second[new], atol=1e-5, rtol=0)
    assert (behaviour[old] - under_second[old]).abs().max() > 1e-3  # the versions differ

    processed, stats = strategy.process_rollout(rollout)
    if epochs == 2:
        _perturb(model, 2)                           # a later optimizer step on this rollout
    generator = torch.Generator().manual_seed(0)
    processed.advantages = torch.randn(mask.shape, generator=generator).where(mask, 0.0)
    _, metrics = strategy.compute_loss(processed)
    if epochs == 1:  # measured by the training forward, reported with the step
        assert "rollout/logprob_diff_max" not in stats
        stats = strategy.step_metrics()
    assert stats["rollout/logprob_diff_max"] > 1e-3

    # by hand: w = pi_prox / pi_behav, r = pi / pi_prox, loss = -w min(r A, clip(r) A)
    with torch.no_grad():
        current = policy_forward(model, processed)["logprobs"]
    proximal, advantages = under_second, processed.advantages
    weight = torch.exp(proximal - behaviour)
    ratio = torch.exp(current - proximal)
    per_token = -weight * torch.minimum(ratio * advantages,
                                        ratio.clamp(0.8, 1.2) * advantages)
    assert metrics["policy_loss"].item() == pytest.approx(per_token[mask].mean().item(), abs=1e-5)
    assert (weight[old] - 1).abs().max() > 1e-3 and (weight[new] - 1).abs().max() < 1e-4
    assert stats["rollout_correction/weight_mean"] == pytest.approx(weight[mask].mean().item(),
                                                                   abs=1e-5)


def test_tokens_older_than_k_versions_are_not_trained_on(tmp_path):
    strategy, run = build_strategy(_config(tmp_path), tmp_path)
    source = strategy.batch_source()
    drawer, model = source.drawer, run.model
    drawer.draw()
    carried = {id(s): len(s.tokens) for g in drawer.groups for s in g.sequences}
    assert any(carried.values())
    for seed in (1, 2):                              # two versions pass: k = 1 is exceeded
        _perturb(model, seed)
        run.rollouts.publish_from(model)
    rollout = drawer.draw()
    stale = (rollout.token_versions < 1) & rollout.context_mask
    assert stale.any()
    assert not (rollout.response_mask & stale).any()  # masked from the loss ...
    assert torch.equal(rollout.context_mask, rollout.response_mask | stale)  # ... kept as context
    staleness = source._staleness(rollout)
    assert staleness["rollout/staleness"] == 0.0  # trained: version 2 only (0 was masked)
    assert staleness["rollout/stale_masked_fraction"] == pytest.approx(
        stale.sum().item() / rollout.context_mask.sum().item())


@pytest.mark.parametrize("change, message", [
    ({"rollout": {"partial": True}}, "rollout.partial"),
    ({"rollout": {"partial": True, "max_staleness": 1}, "no_correction": True},
     "rollout_correction"),
])
def test_partial_needs_staleness_and_the_decoupled_weight(tmp_path, change, message):
    config = _config(tmp_path)
    config["rollout"] = change["rollout"]
    if change.get("no_correction"):
        config["strategy"].pop("rollout_correction")
    with pytest.raises(ConfigError, match=message):
        build_strategy(config, tmp_path)


def test_a_partial_run_resumed_mid_flight_equals_the_uninterrupted_run(tmp_path):
    """The checkpoint holds the sequences in flight (tokens, log-probs, versions), so a
    run killed while some are carried resumes bit-identically."""
    from safetensors.torch import load_file

    from astrai_core.testing import read_metrics
    from tests.training.conftest import astrai, write_config
    from tests.training.test_resume import TIMING, killed_after_checkpoint

    def config(name):
        run = _config(tmp_path)
        run["trainer"].update(max_steps=4, save_every=1)
        run["output_dir"] = str(tmp_path / name)
        return write_config(tmp_path, run, f"{name}.yaml")

    assert astrai("train", str(config("reference"))).returncode == 0
    path = config("interrupted")
    assert killed_after_checkpoint(2, "train", str(path)).returncode == -9
    state = torch.load(tmp_path / "interrupted" / "checkpoints" / "step_2" / "training_state.pt",
                       weights_only=True)["batches"]["drawer"]
    assert any(s["tokens"] for g in state["groups"] for s in g["sequences"])  # killed mid-flight
    resumed = astrai("train", str(path), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    weights = [load_file(str(tmp_path / n / "checkpoints" / "step_4" / "model.safetensors"))
               for n in ("reference", "interrupted")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    strip = lambda r: {k: v for k, v in r.items() if k not in TIMING}  # noqa: E731
    want = [strip(r) for r in read_metrics(tmp_path / "reference")]
    have = [strip(r) for r in read_metrics(tmp_path / "interrupted")]
    assert have == want and any(r["rollout/staleness"] > 0 for r in want)


def test_partial_false_is_the_synchronous_rollout(tmp_path):
    """Without rollout.partial the source draws from the runner itself, as before, and an
    explicit `partial: false` gives the same rollout as no rollout section at all."""
    batches = []
    for rollout in ({}, {"partial": False, "partial_tokens": 3}):
        config = _config(tmp_path)
        config["rollout"] = rollout
        strategy, run = build_strategy(config, tmp_path)
        source = strategy.batch_source()
        assert source.drawer is run.rollouts
        batches.append(source.next_step()[0])
    assert batches[0].token_versions is None
    for name in ("response_ids", "response_mask", "advantages", "old_logprobs"):
        assert torch.equal(getattr(batches[0], name), getattr(batches[1], name)), name
