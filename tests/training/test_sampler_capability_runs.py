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
from astrai_core.api import SamplerCapabilities
from astrai_core.config.schema import RunConfig
from astrai_core.plugins import register, unregister
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing import build_strategy, tiny_run_config, write_arith_prompts
from astrai_core.training.run import train
from astrai_core.training.trainer import Trainer


class MinimalSampler:
    """Only ``generate`` and ``update_weights``, over its own copy of the policy."""

    built: list[MinimalSampler] = []

    def __init__(self, model, tokenizer=None, **engine_options):
        assert not engine_options  # the sampler section's sampling fields are not options
        self._engine = TorchSampler(copy.deepcopy(model), tokenizer)
        self.pushes: list[bool] = []  # whether each update_weights came with tensors
        MinimalSampler.built.append(self)

    def generate(self, prompt_ids, params):
        return self._engine.generate(prompt_ids, params)

    def update_weights(self, state_dict=None):
        self.pushes.append(state_dict is not None)
        return self._engine.update_weights(state_dict)


class Closing(MinimalSampler):
    """Has ``close`` and ``metrics``; whether the run uses them is its declaration's say."""

    def __init__(self, model, tokenizer=None, **engine_options):
        super().__init__(model, tokenizer, **engine_options)
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


def _config(tmp_path, sampler: str, steps: int = 2) -> dict:
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             sampler={"name": sampler, "max_new_tokens": 3}, max_steps=steps)
    config["data"]["batch_size"] = 4
    return config


def test_a_sampler_with_only_generate_and_update_weights_runs_grpo_steps(tmp_path):
    strategy, run = build_strategy(_config(tmp_path, "minimal"), tmp_path)
    assert run.sampler_capabilities == SamplerCapabilities()
    metrics = Trainer(run, strategy).fit()
    assert metrics["loss"] == metrics["loss"]  # trained, finite
    sampler, = MinimalSampler.built
    # it does not share the policy: every publish handed it the trained weights
    assert sampler.pushes == [True, True]
    trained = run.model.state_dict()
    held = sampler._engine.model.state_dict()
    assert all(torch.equal(held[name], trained[name]) for name in trained)


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
