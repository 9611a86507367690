"""Tiny arithmetic runs, built in-process as ``astrai train`` builds them.

A test writes prompt rows, describes a run with :func:`tiny_run_config` and builds the
strategy exactly the way ``astrai train`` does with :func:`build_strategy`::

    from astrai_core.testing import build_strategy, tiny_run_config, write_arith_prompts

    def test_my_strategy(tmp_path):
        prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
        config = tiny_run_config(tmp_path, prompts, {"name": "my_strategy"}, max_steps=2)
        strategy, run = build_strategy(config, tmp_path)
        loss, metrics = strategy.compute_loss(strategy.batch_source().next_step()[0])

The model is a 2-layer, 32-wide decoder built from scratch (seeded by ``trainer.seed``, 0
by default) over the arithmetic example's tokenizer, so a step takes milliseconds on CPU.
``ARITH_TOKENIZER`` is package data (``astrai_core/testing_data/arith_tokenizer``, a copy
of ``examples/arith/tokenizer``), so the kit works from an installed wheel too.
Importing this module is cheap: torch and the training engine load inside the functions.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]  # meaningful in a source checkout only
ARITH_TOKENIZER = Path(__file__).resolve().parents[1] / "testing_data" / "arith_tokenizer"
ARITH_EOS = 5  # <|end|>: the arithmetic tokenizer's end-of-sequence token
TINY_MODEL: dict[str, int] = {
    "hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
    "num_kv_heads": 2, "max_position_embeddings": 64,
}
DIGIT_REWARD = {"name": "format_regex", "pattern": "[0-9]"}  # ~45% for a random tiny model


def write_arith_prompts(path: Path, count: int = 32, **extra_columns: Any) -> Path:
    """``count`` prompt rows "a+b=" (a, b < 10, seed 0) with an ``answer`` column, plus
    ``extra_columns`` (the same value on every row)."""
    rng = random.Random(0)
    with Path(path).open("w") as f:
        for _ in range(count):
            a, b = rng.randrange(10), rng.randrange(10)
            row = {"messages": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
            f.write(json.dumps({**row, **extra_columns}) + "\n")
    return Path(path)


def tiny_run_config(tmp_path: Path, data_path: Path, strategy: dict[str, Any], *,
                    data_format: str = "prompt", data: dict[str, Any] | None = None,
                    rewards: list[dict[str, Any]] | None = None,
                    sampler: dict[str, Any] | None = None, **trainer: Any) -> dict[str, Any]:
    """A run config (a plain dict, as YAML would give) for a tiny from-scratch model on CPU.

    ``data`` and ``sampler`` update the default sections (batch 8; torch sampler,
    temperature 1, 3 new tokens, seed 0, stop at ``ARITH_EOS``); ``rewards`` replaces the
    default digit reward; ``trainer`` keywords update the trainer section (4 constant-lr
    steps, no evaluation, no progress bar). Outputs go to ``tmp_path/run``.
    """
    return {
        "output_dir": str(Path(tmp_path) / "run"),
        "model": {"tokenizer": str(ARITH_TOKENIZER), "config": dict(TINY_MODEL)},
        "data": {"sources": [{"path": str(data_path), "format": data_format}], "batch_size": 8,
                 "cache_dir": str(Path(tmp_path) / "cache"), **(data or {})},
        "strategy": strategy,
        "rewards": list(rewards) if rewards is not None else [dict(DIGIT_REWARD)],
        "sampler": {"name": "torch", "temperature": 1.0, "max_new_tokens": 3, "seed": 0,
                    "stop_token_ids": [ARITH_EOS], **(sampler or {})},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 4, "lr": 1e-2, "schedule": "constant", "eval_at_start": False,
                    "progress": False, **trainer},
    }


def build_strategy(config: dict[str, Any], base_dir: Path) -> tuple[Any, Any]:
    """(strategy, RunComponents) built from ``config`` exactly as ``astrai train`` builds
    them; ``base_dir`` resolves relative data paths."""
    from astrai_core.config.schema import RunConfig
    from astrai_core.training.run import prepare_run

    run, strategy = prepare_run(RunConfig.model_validate(config), base_dir=Path(base_dir))
    return strategy, run


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``, in order."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# `astrai ARGS` in a fresh interpreter; the last stderr line says whether torch was imported.
CLI_PROBE = """
import sys
from astrai_core.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print("TORCH_IMPORTED" if "torch" in sys.modules else "TORCH_NOT_IMPORTED", file=sys.stderr)
sys.exit(code)
"""


def run_astrai(*args: str, cwd: Path | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would; stderr ends with ``TORCH_IMPORTED`` or
    ``TORCH_NOT_IMPORTED`` (so a test can check that a command stays light)."""
    return subprocess.run([sys.executable, "-c", CLI_PROBE, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)
