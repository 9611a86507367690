"""R3 router replay: the torch sampler records every position's MoE experts (through its
shared prefill and the rows it drops), the rollout carries them, and the training
forwards replay them: the sampler's routing and log-probs reproduced, the mismatch
metric measured against an independent count, a GRPO run, an exact resume."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.errors import ConfigError
from astrai_core.model.router_replay import (NOT_ROUTED, ROUTED_EXPERTS, record_routing,
                                             widened_routing)
from astrai_core.rollout import policy_forward
from astrai_core.rollout.dynamic_sampling import concat_rollouts
from astrai_core.rollout.records import as_prompt_record
from astrai_core.rollout.runner import RolloutRunner
from astrai_core.sampling import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing import build_strategy, read_metrics
from tests.rl.test_router_replay import _model, _moe_run

TOLERANCE = 1e-5  # the sampler's KV-cached log-probs against one full forward (float32)


def _own_routing(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, L, S, k]: the experts ``model`` picks by itself in one full forward."""
    with torch.no_grad(), record_routing(model) as tape:
        model(ids, attention_mask=mask)
    return tape.stacked(*ids.shape)


def _sampled(model, prompts, params, **options):
    return TorchSampler(model, **options).generate(prompts, params, record_routing=True)


# -------------------------------------------------------------------- the sampler's record
def test_routing_follows_each_completion_through_shared_prefill_and_dropped_rows():
    model = _model()
    prompts = [[1, 2, 3, 4, 5, 6, 7], [7, 8], [9, 10, 11], [12]]
    # ragged prompts, n=3 (a shared prefill per prompt), stop tokens and per-prompt lengths
    # (rows leave the batch at different steps), and a batch split in two (max_batch_size)
    params = [SamplingParams(max_new_tokens=length, n=3, seed=seed, stop_token_ids=(3, 4, 5, 6))
              for seed, length in enumerate((7, 5, 9, 1))]
    completions = _sampled(model, prompts, params, max_batch_size=5)
    lengths = {len(c.token_ids) for c in completions}
    assert len(lengths) >= 3 and any(c.finish_reason == "stop" for c in completions)
    for completion in completions:
        sequence = torch.tensor([prompts[completion.prompt_index] + completion.token_ids])
        reference = _own_routing(model, sequence)[0]  # this sequence alone, unbatched
        routed = completion.routed_experts
        assert routed.dtype == torch.int16 and routed.shape == reference.shape
        # every position the sampler fed matches; its last token was never fed back
        assert torch.equal(routed[:, :-1].long(), reference[:, :-1])
        assert (routed[:, -1] == NOT_ROUTED).all()


def test_recording_changes_nothing_and_is_off_by_default():
    model = _model()
    params = SamplingParams(max_new_tokens=6, n=2, seed=3)
    plain = TorchSampler(model).generate([[1, 2, 3], [4, 5]], params)
    recorded = _sampled(model, [[1, 2, 3], [4, 5]], params)
    assert all(c.routed_experts is None for c in plain)
    assert [c.token_ids for c in plain] == [c.token_ids for c in recorded]
    assert [c.logprobs for c in plain] == [c.logprobs for c in recorded]
    assert all(block.routing is None for block in model.modules() if hasattr(block, "routing"))


# -------------------------------------------------------------------- the rollout's layout
def test_the_rollout_carries_the_routing_on_its_forward_positions(tmp_path):
    strategy, run = build_strategy(_moe_run(tmp_path, "R3"), tmp_path)
    rollout = run.rollouts.draw()
    experts = rollout.extras[ROUTED_EXPERTS]
    mask = rollout.attention_mask().bool()
    assert experts.shape[::2] == (len(rollout), mask.shape[1])  # [N, L, P + R, k]
    own = _own_routing(run.model, rollout.input_ids(), rollout.attention_mask())
    known = (experts != NOT_ROUTED).all(-1).all(1)  # [N, P + R]
    last = rollout.prompt_ids.shape[1] + rollout.response_lengths() - 1
    expected_known = mask.clone()
    expected_known[torch.arange(len(rollout)), last] = False  # the last token is never fed
    assert torch.equal(known, expected_known)
    assert torch.equal(experts.long().transpose(1, 2)[known], own.transpose(1, 2)[known])
    # validation rollouts do not pay for it
    one_off = run.rollouts.rollout([as_prompt_record({"prompt_ids": [1, 2]})])
    assert ROUTED_EXPERTS not in one_off.extras


def test_joined_rollouts_keep_every_row_on_its_positions(tmp_path):
    """Dynamic sampling joins rollouts of other widths: each row's routing stays on its
    tokens (compared row by row against the parts)."""
    strategy, run = build_strategy(_moe_run(tmp_path, "R3"), tmp_path)
    parts = [run.rollouts.draw() for _ in range(3)]
    joined = concat_rollouts(parts)
    experts = joined.extras[ROUTED_EXPERTS]
    start = 0
    for part in parts:
        for row in range(len(part)):
            mine = part.extras[ROUTED_EXPERTS][row][:, part.attention_mask()[row].bool()]
            theirs = experts[start + row][:, joined.attention_mask()[start + row].bool()]
            assert torch.equal(mine, theirs)
        start += len(part)
    assert (widened_routing(experts, joined.prompt_ids.shape[1], joined.prompt_ids.shape[1] + 2,
                            joined.response_ids.shape[1])[:, :, :2] == NOT_ROUTED).all()


# -------------------------------------------------------------------- the trainer's replay
def _first_micro_batch(tmp_path, **strategy_options):
    strategy, run = build_strategy(_moe_run(tmp_path, "R3", **strategy_options), tmp_path)
    return strategy, run, strategy.batch_source().next_step()[0]


def test_replay_reproduces_the_samplers_routing_and_logprobs(tmp_path):
    strategy, run, batch = _first_micro_batch(tmp_path)
    model, mask = run.model, batch.response_mask
    experts = batch.extras[ROUTED_EXPERTS]
    known = (experts != NOT_ROUTED).all(-1)  # [N, L, S]
    own = _own_routing(model, batch.input_ids(), batch.attention_mask())
    assert torch.equal(own[known], experts.long()[known])  # the policy routes like the sampler
    model.train()
    with strategy.routing.training_forward(model, batch):
        out = policy_forward(model, batch, run.logprob_temperature)
    diff = (out["logprobs"].detach() - batch.old_logprobs).abs()[mask]
    assert diff.max().item() <= TOLERANCE  # the sampler's own log-probs
    assert strategy.step_metrics()["router/replay_mismatch"] == 0.0


def test_a_perturbed_router_moves_routing_and_logprobs_unless_replayed(tmp_path):
    strategy, run, batch = _first_micro_batch(tmp_path)
    model, mask = run.model, batch.response_mask
    experts = batch.extras[ROUTED_EXPERTS]
    with torch.no_grad():
        for layer in model.layers:
            layer.mlp.router.weight.add_(0.5 * torch.randn_like(layer.mlp.router.weight))
    model.train()
    free = policy_forward(model, batch, run.logprob_temperature)["logprobs"].detach()
    with strategy.routing.training_forward(model, batch):
        replayed = policy_forward(model, batch, run.logprob_temperature)["logprobs"].detach()
    own = _own_routing(model, batch.input_ids(), batch.attention_mask())
    # an independent count: real positions the sampler routed where some layer now differs
    counted = (experts != NOT_ROUTED).all(-1).all(1) & batch.attention_mask().bool()
    differs = (own.sort(-1).values != experts.long().sort(-1).values).any(-1).any(1)
    assert differs[counted].any()
    assert (free - batch.old_logprobs).abs()[mask].max() > 1e-3
    assert not torch.allclose(replayed[mask], free[mask])
    expected = differs[counted].float().mean().item()
    assert strategy.step_metrics()["router/replay_mismatch"] == pytest.approx(expected)


# -------------------------------------------------------------------- runs and errors
@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_an_online_run_with_r3_trains_and_logs_the_mismatch(tmp_path, name):
    from astrai_core.training.trainer import Trainer

    config = _moe_run(tmp_path, "R3", epochs=2, mini_batches=1)
    config["strategy"]["name"] = name
    strategy, run = build_strategy(config, tmp_path)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    Trainer(run, strategy).fit()
    metrics = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert len(metrics) == 4
    mismatch = [m["router/replay_mismatch"] for m in metrics]
    # each rollout's first step trains the policy that sampled it: the sampler's routing
    # and log-probs exactly; its second epoch (after an update at lr 1e-2) sees routing move
    assert mismatch[0] == 0.0 and mismatch[2] == 0.0 and mismatch[1] > 0.0
    assert metrics[0]["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
    assert any(not torch.equal(before[k], v) for k, v in run.model.state_dict().items())


def test_r3_with_a_multi_turn_environment_is_refused():
    with pytest.raises(ConfigError, match="router_replay: R3.*multi-turn"):
        RolloutRunner(None, None, None, SamplingParams(), group_size=2, prompt_source=[],
                      episodes=object(), record_routing=True)


def test_a_mid_rollout_checkpoint_of_an_r3_run_resumes_exactly(tmp_path):
    from tests.training.conftest import astrai, write_config
    from tests.training.test_resume import TIMING, killed_after_checkpoint

    def config(name):
        run = _moe_run(tmp_path, "R3", epochs=2, group_size=4)
        run["trainer"].update(max_steps=4, save_every=1)
        run["output_dir"] = str(tmp_path / name)
        return run

    assert astrai("train", str(write_config(tmp_path, config("reference"), "a.yaml"))
                  ).returncode == 0
    path = write_config(tmp_path, config("interrupted"), "b.yaml")
    assert killed_after_checkpoint(1, "train", str(path)).returncode == -9
    state = load_file(str(tmp_path / "interrupted" / "checkpoints" / "step_1" /
                          "state_tensors.safetensors"))
    assert state[f"extras.{ROUTED_EXPERTS}"].dtype == torch.int16  # the rollout's routing
    resumed = astrai("train", str(path), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    final = [load_file(str(tmp_path / name / "checkpoints" / "step_4" / "model.safetensors"))
             for name in ("reference", "interrupted")]
    assert all(torch.equal(final[0][key], final[1][key]) for key in final[0])
    strip = lambda r: {k: v for k, v in r.items() if k not in TIMING}  # noqa: E731
    assert ([strip(r) for r in read_metrics(tmp_path / "interrupted")] ==
            [strip(r) for r in read_metrics(tmp_path / "reference")])
