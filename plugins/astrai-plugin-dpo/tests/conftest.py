"""Tiny dpo runs: preference and prompt data, a run config and an in-process strategy."""

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


def write_pairs(path: Path, count: int = 8) -> Path:
    """Preference rows: the right sum (of varying length) chosen over a wrong one."""
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(20), rng.randrange(10)
            row = {"messages": [{"role": "user", "content": f"{a}+{b}="}],
                   "chosen": str(a + b), "rejected": str(a + b + 1 + rng.randrange(90))}
            f.write(json.dumps(row) + "\n")
    return path


def write_prompts(path: Path, count: int = 32) -> Path:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(10), rng.randrange(10)
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{a}+{b}="}],
                                "answer": str(a + b)}) + "\n")
    return path


def run_config(tmp_path: Path, data_path: Path, data_format: str, strategy: dict,
               **trainer) -> dict:
    return {
        "output_dir": str(tmp_path / "run"),
        "model": {"tokenizer": str(TOKENIZER), "config": dict(TINY_MODEL)},
        "data": {"sources": [{"path": str(data_path), "format": data_format}], "batch_size": 8,
                 "cache_dir": str(tmp_path / "cache")},
        "strategy": strategy,
        "rewards": [{"name": "format_regex", "pattern": "[0-9]"}],
        "sampler": {"name": "torch", "temperature": 1.0, "max_new_tokens": 3, "seed": 0,
                    "stop_token_ids": [END_TOKEN]},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 4, "lr": 1e-2, "schedule": "constant", "eval_at_start": False,
                    "progress": False, **trainer},
    }


def make_strategy(tmp_path: Path, config: dict):
    """(strategy, context) built in-process the way `astrai train` builds them."""
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
    return strategy, context


class Helpers:
    """The helpers above, for test modules (importlib mode cannot import this conftest)."""

    write_pairs = staticmethod(write_pairs)
    write_prompts = staticmethod(write_prompts)
    run_config = staticmethod(run_config)
    make_strategy = staticmethod(make_strategy)


@pytest.fixture
def dpo_helpers() -> type[Helpers]:
    return Helpers
