"""policy_forward against unpadded per-row forwards; the runner with the torch sampler agrees
with the trainer (the loop's mismatch measure); evaluation by generation."""

from __future__ import annotations

import pytest
import torch

from astrai_core.online.mismatch import rollout_mismatch
from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner, evaluate_generation, policy_forward
from astrai_core.sampling import SamplingParams, TorchSampler

PROMPTS = [[5, 9, 12], [7, 3], [1, 2, 3, 4, 5, 6, 7], [40]]


def prompt_records():
    return [{"prompt_ids": p, "prompt_text": str(p), "columns": {"answer": "1"}} for p in PROMPTS]


@pytest.fixture
def rollout(native_model):
    sampler = TorchSampler(model=native_model)
    params = SamplingParams(max_new_tokens=6, temperature=0.9, top_k=10, seed=0,
                            stop_token_ids=(3,))
    runner = RolloutRunner(sampler, tokenizer=None, rewards=RewardSet.from_config([{"name": "exact_match"}]),
                           sampling_params=params, group_size=2, prompt_source=prompt_records(),
                           prompts_per_rollout=4)
    return runner, runner.draw()


def test_policy_forward_matches_unpadded_forward_per_row(native_model, rollout):
    _, batch = rollout
    with torch.no_grad():
        out = policy_forward(native_model, batch, temperature=0.9, return_hidden_states=True,
                             return_entropy=True)
        for row in range(len(batch)):
            prompt = batch.prompt_ids[row][batch.prompt_mask[row]].tolist()
            response = batch.response_ids[row][batch.response_mask[row]].tolist()
            single = native_model(torch.tensor([prompt + response]), return_hidden_states=True)
            before = slice(len(prompt) - 1, len(prompt) + len(response) - 1)  # predicts each token
            logprobs = (single["logits"][0, before] / 0.9).log_softmax(-1)
            expected = logprobs.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
            entropy = -(logprobs.exp() * logprobs).sum(-1)
            n = len(response)
            assert torch.allclose(out["logprobs"][row, :n], expected, atol=1e-5)
            assert torch.allclose(out["entropy"][row, :n], entropy, atol=1e-5)
            assert torch.allclose(out["hidden_states"][row, :n], single["hidden_states"][0, before], atol=1e-5)


def logprob_diff(model, batch, temperature):
    """The mismatch metrics of ``batch`` against ``model``'s no-grad forward, measured as
    the online loop measures them."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            trainer = policy_forward(model, batch, temperature=temperature)["logprobs"]
    finally:
        model.train(was_training)
    return rollout_mismatch(trainer, batch.old_logprobs, batch.response_mask)[1]


def test_runner_logprobs_agree_with_the_trainer(native_model, rollout):
    runner, batch = rollout
    assert len(batch) == 8 and batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    diff = logprob_diff(native_model, batch, temperature=runner.logprob_temperature)
    assert diff["rollout/logprob_diff_max"] <= 1e-5
    assert 0 <= diff["rollout/logprob_diff_mean"] <= diff["rollout/logprob_diff_max"]
    # The metric does detect a mismatch: the same tokens at another temperature differ.
    assert logprob_diff(native_model, batch, temperature=1.0)["rollout/logprob_diff_max"] > 1e-2


class ScriptedSampler:
    """Answers prompt i with the text in ``answers[i]``."""

    policy_version = 0

    def __init__(self, answers):
        self.answers = answers
        self.params = []

    def generate(self, prompts, params):
        from astrai_core.sampling import Completion

        self.params.append(params)
        return [Completion(token_ids=[1, 2], logprobs=[0.0, 0.0], finish_reason="stop",
                           text=self.answers[p[0]], prompt_index=i) for i, p in enumerate(prompts)]


def test_evaluate_generation_reports_accuracy_and_reward_means():
    answers = {0: "0", 1: "so 2", 2: "4?", 3: "7"}            # answer column is 2 * id: 3 of 4 right
    records = [{"prompt_ids": [i], "columns": {"answer": str(2 * i)}} for i in range(4)]
    rewards = RewardSet.from_config([{"name": "exact_match"},
                                     {"name": "format_regex", "pattern": r"\d+", "mode": "fullmatch",
                                      "weight": 0.5}])
    sampler = ScriptedSampler(answers)
    tokenizer = type("Tok", (), {"eos_token_id": 5, "decode": lambda self, ids, **k: "p"})()
    metrics = evaluate_generation(sampler, tokenizer, records, rewards, max_new_tokens=8, batch_size=3)
    assert metrics["eval/accuracy"] == 0.75
    assert metrics["eval/reward/exact_match"] == 0.75
    assert metrics["eval/reward/format_regex"] == 0.5             # "0" and "7" are all digits
    assert metrics["eval/reward"] == pytest.approx((3 + 0.5 * 2) / 4)
    assert all(p.temperature == 0.0 and p.stop_token_ids == (5,) for p in sampler.params)
    assert len(sampler.params) == 2                                 # batches of 3 then 1


def test_evaluate_generation_greedy_with_the_torch_sampler(native_model):
    sampler = TorchSampler(model=native_model)
    tokenizer = type("Tok", (), {"eos_token_id": None,
                                 "decode": lambda self, ids, **k: " ".join(map(str, ids))})()
    greedy = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=3, temperature=0.0))
    # Make the answer of prompts 0 and 2 the final token they greedily produce.
    records = [{"prompt_ids": p, "columns": {"answer": str(c.token_ids[-1]) if i in (0, 2) else "-1"}}
               for i, (p, c) in enumerate(zip(PROMPTS, greedy, strict=True))]
    metrics = evaluate_generation(sampler, tokenizer, records, RewardSet.from_config([{"name": "exact_match"}]),
                                  max_new_tokens=3, batch_size=2)
    assert metrics["eval/accuracy"] == 0.5
    assert metrics["eval/response_length"] == 3.0
