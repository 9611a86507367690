"""Runs with samplers that declare little or nothing: what the trainer does with a sampler
follows its declared capabilities, never the methods it happens to have."""

from __future__ import annotations

import copy
import dataclasses
import sys
import types

import pytest
import torch

from astrai_core import SamplerSpec, hookimpl
from astrai_core.api import ConfigError, SamplerCapabilities
from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.plugins import register, unregister
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing import build_strategy, tiny_run_config, write_arith_prompts
from astrai_core.training.run import train
from astrai_core.training.trainer import Trainer


class MinimalSampler:
    """Only ``generate`` and ``update_weights``, over its own copy of the policy; no
    ``Config`` and no engine options: the sampler section's sampling fields reach it as
    the SamplingParams of ``generate``."""

    built: list[MinimalSampler] = []

    def __init__(self, model=None, tokenizer=None):
        self._engine = TorchSampler(copy.deepcopy(model), tokenizer)
        self.pushes: list[bool] = []  # whether each update_weights came with tensors
        self.params: list = []  # the SamplingParams of every generate call
        MinimalSampler.built.append(self)

    def generate(self, prompt_ids, params):
        self.params += params if isinstance(params, list) else [params]
        return self._engine.generate(prompt_ids, params)

    def update_weights(self, state_dict=None):
        self.pushes.append(state_dict is not None)
        return self._engine.update_weights(state_dict)


class Closing(MinimalSampler):
    """Has ``close`` and ``metrics``; whether the run uses them is its declaration's say."""

    def __init__(self, model=None, tokenizer=None):
        super().__init__(model, tokenizer)
        self.closed = self.metrics_read = 0

    def close(self):
        self.closed += 1

    def metrics(self):
        self.metrics_read += 1
        return {"rollout/my_metric": 1.0}


class DeclaredClosing(Closing):
    capabilities = SamplerCapabilities(needs_close=True, reports_metrics=True)


@pytest.fixture(autouse=True)
def _samplers(monkeypatch):
    module = types.ModuleType("capability_run_samplers")
    module.MinimalSampler, module.Closing = MinimalSampler, Closing
    module.DeclaredClosing = DeclaredClosing

    @hookimpl
    def astrai_samplers():
        return [SamplerSpec(name=name, target=f"capability_run_samplers:{target}", summary=name)
                for name, target in (("minimal", "MinimalSampler"), ("closing", "Closing"),
                                     ("declared_closing", "DeclaredClosing"))]

    module.astrai_samplers = astrai_samplers
    monkeypatch.setitem(sys.modules, module.__name__, module)
    MinimalSampler.built.clear()
    register(module)
    yield
    unregister(module)


def _config(tmp_path, sampler: str, steps: int = 2, **options) -> dict:
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             sampler={"name": sampler, "max_new_tokens": 3, **options},
                             max_steps=steps)
    config["data"]["batch_size"] = 4
    return config


def test_a_sampler_with_only_generate_and_update_weights_runs_grpo_steps(tmp_path):
    config = _config(tmp_path, "minimal", max_new_tokens=4, temperature=1.0)
    strategy, run = build_strategy(config, tmp_path)
    assert run.sampler_capabilities == SamplerCapabilities()
    metrics = Trainer(run, strategy).fit()
    assert metrics["loss"] == metrics["loss"]  # trained, finite
    sampler, = MinimalSampler.built
    # the sampling fields came in generate's SamplingParams: 2 rollouts of 4 prompts
    assert len(sampler.params) == 2 * 4
    assert {(p.max_new_tokens, p.temperature, p.n) for p in sampler.params} == {(4, 1.0, 2)}
    # it does not share the policy: every publish handed it the trained weights
    assert sampler.pushes == [True, True]
    trained = run.model.state_dict()
    held = sampler._engine.model.state_dict()
    assert all(torch.equal(held[name], trained[name]) for name in trained)


@pytest.mark.parametrize("options, message", [
    ({"beam_width": 4}, "sampler.beam_width: unknown option"),
    ({"temperature": "hot"}, "sampler.temperature:"),
])
def test_a_sampler_without_config_refuses_a_bad_option_in_one_line(tmp_path, options, message):
    with pytest.raises(ConfigError) as error:
        plan_run(RunConfig.model_validate(_config(tmp_path, "minimal", **options)))
    text = str(error.value)
    assert message in text and "\n" not in text, text
    assert not MinimalSampler.built


def test_a_torch_sampler_shares_the_policy_and_one_that_says_otherwise_gets_tensors(tmp_path):
    """The same engine either way: the declaration alone decides what a publish passes."""
    strategy, run = build_strategy(_config(tmp_path, "torch", steps=1), tmp_path)
    assert run.sampler_capabilities.shares_policy
    assert run.rollouts._weights_for_sampler(run.model) is None
    copying = dataclasses.replace(run.sampler_capabilities, shares_policy=False)
    run.rollouts.capabilities = copying
    weights = run.rollouts._weights_for_sampler(run.model)
    assert weights.keys() == run.model.state_dict().keys()


@pytest.mark.parametrize("name, declared", [("closing", False), ("declared_closing", True)])
def test_close_and_metrics_are_used_only_when_declared(tmp_path, name, declared):
    metrics = train(RunConfig.model_validate(_config(tmp_path, name)))
    sampler, = MinimalSampler.built
    assert (sampler.closed, sampler.metrics_read > 0) == (int(declared), declared)
    assert ("rollout/my_metric" in metrics) == declared
