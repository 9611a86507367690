"""Tiny ppo runs: prompt data, run configs, an in-process strategy and a hand-made rollout."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
TOKENIZER = REPO / "examples" / "arith" / "tokenizer"
END_TOKEN = 5  # <|end|>, the arithmetic tokenizer's EOS
TINY_MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
              "num_kv_heads": 2, "max_position_embeddings": 64}


def write_prompts(path: Path, count: int = 32) -> Path:
    """Arithmetic prompt rows (chat messages + an `answer` column)."""
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(10), rng.randrange(10)
            row = {"messages": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
            f.write(json.dumps(row) + "\n")
    return path


def run_config(tmp_path: Path, strategy: dict, **trainer: object) -> dict:
    """A tiny from-scratch ppo run over `prompts.jsonl` in ``tmp_path``."""
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        write_prompts(prompts)
    return {
        "output_dir": str(tmp_path / "run"),
        "model": {"tokenizer": str(TOKENIZER), "config": dict(TINY_MODEL)},
        "data": {"sources": [{"path": str(prompts), "format": "prompt"}], "batch_size": 4,
                 "cache_dir": str(tmp_path / "cache")},
        "strategy": {"name": "ppo", **strategy},
        "rewards": [{"name": "format_regex", "pattern": "[0-9]"}],
        "sampler": {"name": "torch", "temperature": 1.0, "max_new_tokens": 4, "seed": 0,
                    "stop_token_ids": [END_TOKEN]},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 4, "lr": 1e-2, "schedule": "constant", "eval_at_start": False,
                    "progress": False, **trainer},
    }


def make_strategy(tmp_path: Path, config: dict):
    """(strategy after setup(), context) built in-process the way `astrai train` builds them."""
    from astrai_core.config.schema import RunConfig
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.devices.select import resolve_device
    from astrai_core.plugins import load_plugins
    from astrai_core.training.config import TrainerConfig
    from astrai_core.training.context import TrainContext
    from astrai_core.training.run import build_model

    registry = load_plugins()
    run = RunConfig.model_validate(config)
    backend = resolve_device(registry, "cpu")
    tokenizer = load_tokenizer(TOKENIZER)
    torch.manual_seed(0)
    model = build_model(run.model, tokenizer)
    context = TrainContext(run_config=run, trainer_config=TrainerConfig.model_validate(run.trainer),
                           registry=registry, backend=backend, device=backend.device(0),
                           model=model, tokenizer=tokenizer, tokenizer_dir=TOKENIZER,
                           base_dir=tmp_path, output_dir=tmp_path / "run")
    strategy_class = registry.get("strategy", run.strategy.name).load()
    strategy = strategy_class(strategy_class.Config.model_validate(run.strategy.params), context)
    strategy.setup()
    return strategy, context


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

    write_prompts = staticmethod(write_prompts)
    run_config = staticmethod(run_config)
    make_strategy = staticmethod(make_strategy)
    fixed_rollout = staticmethod(fixed_rollout)
    real_tokens = staticmethod(real_tokens)
    tiny_model = TINY_MODEL
    end_token = END_TOKEN


@pytest.fixture
def ppo() -> type[Helpers]:
    return Helpers
