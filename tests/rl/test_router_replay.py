"""MoE router replay: recorded experts replayed exactly; the mismatch metric; R2 in a run;
R3 refused at plan time for a sampler that cannot report routing (R3 itself:
test_router_replay_r3.py)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.errors import ConfigError
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.router_replay import record_routing, replay_routing
from astrai_core.rl.functional import token_logprobs
from astrai_core.testing import (TINY_MODEL, build_strategy, read_metrics, tiny_run_config,
                                 write_arith_prompts)

MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16}


def _model() -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(vocab_size=40, **TINY_MODEL, **MOE))
    model.reset_parameters(std=0.3)
    return model


def _batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (4, 12), generator=generator)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, :3] = 0  # a left-padded row
    return ids, mask


def _logprobs(model, ids, mask):
    logits = model(ids, attention_mask=mask)["logits"][:, :-1]
    return token_logprobs(logits, ids[:, 1:])


def _used_experts(model):
    """Capture the experts each MoE layer's Experts module receives, in layer order."""
    used = []
    for layer in model.layers:
        experts = layer.mlp.experts
        original = experts.forward
        experts.forward = (lambda x, selected, weights, _f=original:
                           used.append(selected.clone()) or _f(x, selected, weights))
    return used


def test_replay_reproduces_the_recorded_routing_and_logprobs_exactly():
    model, (ids, mask) = _model(), _batch()
    with torch.no_grad(), record_routing(model) as tape:
        model.eval()
        recorded_logprobs = _logprobs(model, ids, mask)
    experts = tape.stacked(*ids.shape)
    assert experts.shape == (4, 2, 12, 2)
    model.train()
    used = _used_experts(model)
    with replay_routing(model, experts, mask) as replay:
        logprobs = _logprobs(model, ids, mask)  # with grad, in training mode
    assert torch.equal(logprobs.detach(), recorded_logprobs)
    for layer, selected in enumerate(used):
        assert torch.equal(selected, experts[:, layer].reshape(-1, 2))
    assert replay.mismatch() == (0, int(mask.sum()))
    logprobs.sum().backward()  # the router still gets a gradient through the expert weights
    assert model.layers[0].mlp.router.weight.grad.abs().sum() > 0


def test_a_perturbed_router_changes_routing_unless_replayed():
    model, (ids, mask) = _model(), _batch()
    with torch.no_grad(), record_routing(model) as tape:
        recorded_logprobs = _logprobs(model, ids, mask)
    experts = tape.stacked(*ids.shape)
    with torch.no_grad():
        for layer in model.layers:
            layer.mlp.router.weight.add_(0.5 * torch.randn_like(layer.mlp.router.weight))
        with record_routing(model) as own:
            free_logprobs = _logprobs(model, ids, mask)
        now = own.stacked(*ids.shape)
        used = _used_experts(model)
        with replay_routing(model, experts, mask) as replay:
            replayed_logprobs = _logprobs(model, ids, mask)
    # without replay the routing and the log-probs move
    differs = (now.sort(-1).values != experts.sort(-1).values).any(-1).any(1)  # [B, S]
    assert differs[mask.bool()].any()
    assert not torch.allclose(free_logprobs, recorded_logprobs, atol=1e-4)
    # with replay every layer used the recorded experts, and the metric counts exactly the
    # (real) tokens whose own routing differs in some layer
    for layer, selected in enumerate(used):
        assert torch.equal(selected, experts[:, layer].reshape(-1, 2))
    assert replay.mismatch() == (int(differs[mask.bool()].sum()), int(mask.sum()))
    assert not torch.equal(replayed_logprobs, free_logprobs)


def _moe_run(tmp_path, replay: str, **strategy):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2,
                                                 "router_replay": replay, **strategy},
                             data={"batch_size": 4}, max_steps=4)
    config["model"]["config"].update(MOE)
    return config


def test_r2_in_a_grpo_run_logs_the_replay_mismatch(tmp_path):
    from astrai_core.training.trainer import Trainer

    strategy, run = build_strategy(_moe_run(tmp_path, "R2", epochs=2), tmp_path)
    Trainer(run, strategy).fit()
    metrics = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    mismatch = [m["router/replay_mismatch"] for m in metrics]
    # step 1 trains the policy that scored the rollout: nothing to correct; step 2 (the
    # rollout's second epoch, after an update at lr 1e-2) sees some routing moved
    assert mismatch[0] == 0.0 and mismatch[2] == 0.0
    assert all(0.0 <= value <= 1.0 for value in mismatch)
    assert metrics[0]["ratio_max"] == pytest.approx(1.0, abs=1e-5)


NO_ROUTING_PLUGIN = """
from astrai_core import hookimpl, SamplerSpec

@hookimpl
def astrai_samplers():
    return [SamplerSpec(name="no_routing", target="astrai_core.sampling.torch_sampler:TorchSampler",
                        summary="the torch sampler, under a spec that reports no routing")]
"""


def test_r3_with_a_sampler_that_cannot_report_routing_is_a_config_error(tmp_path, monkeypatch):
    from astrai_core.config.plan import plan_run
    from astrai_core.config.schema import RunConfig
    from tests.training.conftest import install_plugin

    install_plugin(tmp_path, monkeypatch, "no_routing_plugin",
                   {"no_routing_plugin": NO_ROUTING_PLUGIN})
    config = _moe_run(tmp_path, "R3")
    config["sampler"]["name"] = "no_routing"
    with pytest.raises(ConfigError, match=r"strategy\.router_replay.*sampler 'no_routing' does "
                                          r"not report MoE routing"):
        plan_run(RunConfig.model_validate(config), registry=None)


def test_replay_on_a_dense_model_is_refused(tmp_path):
    config = _moe_run(tmp_path, "R2")
    for key in MOE:
        del config["model"]["config"][key]
    strategy, _ = build_strategy(config, tmp_path)
    with pytest.raises(ConfigError, match="no MoE layer"):
        strategy.batch_source()
