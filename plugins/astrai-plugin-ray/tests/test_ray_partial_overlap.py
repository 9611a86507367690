"""Partial rollouts overlapped with training on Ray workers: the workers decode while the
trainer steps, a weight push interrupts them between two decode steps, the sequences in
flight continue under the new weights, and every token's behaviour log-prob is the one
the weights of its recorded version give."""

from __future__ import annotations

import copy
import time

import torch

from astrai_core.api import SamplingParams
from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner
from astrai_core.rollout.forward import policy_forward
from astrai_core.rollout.partial import PartialRollouts
from astrai_plugin_ray.sampler import RaySampler

SLOW = {"name": "slow_step_torch", "token_delay_s": 0.004}
PROMPTS = [{"prompt_ids": [1 + i % 9, 2 + i % 7, 5], "columns": {"answer": "x"}} for i in range(64)]


def _tiny_model():
    from astrai_core.api import CausalLM, ModelConfig
    from astrai_core.testing import TINY_MODEL

    torch.manual_seed(0)
    return CausalLM(ModelConfig(vocab_size=32, **TINY_MODEL))


def _train_a_little(model):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)


def _expected_logprobs(rollout, snapshots, model):
    """Each token's log-prob under the weights of the version it records."""
    reference = copy.deepcopy(model)
    expected = torch.zeros_like(rollout.old_logprobs)
    for version in rollout.token_versions.unique().tolist():
        reference.load_state_dict(snapshots[version])
        with torch.no_grad():
            logprobs = policy_forward(reference.eval(), rollout, 1.0)["logprobs"]
        expected = torch.where(rollout.token_versions == version, logprobs, expected)
    return expected


def test_a_push_lands_between_decode_steps_and_each_token_names_its_weights(ray_session):
    model = _tiny_model()
    sampler = RaySampler(model=model, workers=1, worker_resources={"CPU": 1},
                         worker_sampler=SLOW)
    try:
        runner = RolloutRunner(sampler, tokenizer=None,
                               rewards=RewardSet.from_config([{"name": "exact_match"}]),
                               sampling_params=SamplingParams(max_new_tokens=40, seed=3,
                                                              stop_token_ids=(3, 7)),
                               group_size=2, prompts_per_rollout=2, prompt_source=PROMPTS,
                               asynchronous=True)  # as the ray spec says
        # segments as long as a completion: only an interrupt splits a sequence's versions
        drawer = PartialRollouts(runner, segment_tokens=40, max_staleness=8, overlap=True)
        snapshots = {0: copy.deepcopy(model.state_dict())}
        rollouts = []
        for _ in range(5):
            rollouts.append(drawer.draw())
            time.sleep(0.1)  # the trainer steps while the worker decodes
            _train_a_little(model)
            snapshots[runner.publish()] = copy.deepcopy(model.state_dict())
        split = 0
        for rollout in rollouts:
            sampled = rollout.response_mask if rollout.context_mask is None else rollout.context_mask
            expected = _expected_logprobs(rollout, snapshots, model)
            assert torch.allclose(rollout.old_logprobs[sampled], expected[sampled], atol=1e-5)
            for row in range(len(rollout)):
                split += len(rollout.token_versions[row][sampled[row]].unique()) > 1
        assert split > 0  # some sequences were interrupted mid-decode and continued
    finally:
        sampler.close()
