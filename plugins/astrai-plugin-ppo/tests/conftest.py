"""Tiny ppo runs (through the test kit, astrai_core.testing) and a hand-made rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from astrai_core import testing


def run_config(tmp_path: Path, strategy: dict, **trainer: object) -> dict:
    """A tiny from-scratch ppo run over `prompts.jsonl` in ``tmp_path`` (batch 4, 4 new tokens)."""
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        testing.write_arith_prompts(prompts)
    return testing.tiny_run_config(tmp_path, prompts, {"name": "ppo", **strategy},
                                   data={"batch_size": 4}, sampler={"max_new_tokens": 4},
                                   **trainer)


def make_strategy(tmp_path: Path, config: dict):
    """(strategy, run components) built in-process the way `astrai train` builds them."""
    return testing.build_strategy(config, tmp_path)


def fixed_rollout(vocab_size: int, seed: int = 0):
    """Three rows with LEFT-padded prompts of lengths 3, 5, 1 and RIGHT-padded responses of
    lengths 4, 2, 3 (padding ids are random garbage: only the masks describe padding)."""
    from astrai_core.rollout.batch import RolloutBatch

    generator = torch.Generator().manual_seed(seed)
    prompt_lengths, response_lengths = [3, 5, 1], [4, 2, 3]
    prompt_ids = torch.randint(6, vocab_size, (3, 5), generator=generator)
    response_ids = torch.randint(6, vocab_size, (3, 4), generator=generator)
    prompt_mask = torch.tensor([[i >= 5 - n for i in range(5)] for n in prompt_lengths])
    response_mask = torch.tensor([[i < n for i in range(4)] for n in response_lengths])
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
        response_mask=response_mask, old_logprobs=torch.zeros(3, 4),
        rewards=torch.tensor([1.0, 0.0, 2.0]), reward_components={},
        group_ids=torch.tensor([0, 0, 1]))


def real_tokens(batch, row: int) -> tuple[torch.Tensor, int, int]:
    """(the row's real tokens [1, L] without any padding, prompt length, response length)."""
    prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
    response = batch.response_ids[row][batch.response_mask[row]]
    return torch.cat([prompt, response]).unsqueeze(0), len(prompt), len(response)


class Helpers:
    """The helpers above, for test modules (importlib mode cannot import this conftest)."""

    run_config = staticmethod(run_config)
    make_strategy = staticmethod(make_strategy)
    fixed_rollout = staticmethod(fixed_rollout)
    real_tokens = staticmethod(real_tokens)


@pytest.fixture
def ppo() -> type[Helpers]:
    return Helpers
