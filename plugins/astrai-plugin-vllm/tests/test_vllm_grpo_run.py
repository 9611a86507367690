"""An online GRPO run of the arithmetic example with `sampler: {name: vllm}`, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[3]
ARITH = REPO / "examples" / "arith"
END_TOKEN = 5  # <|end|>
STEPS = 6


def _config(tmp_path: Path, data: Path) -> dict:
    return {
        "output_dir": str(tmp_path / "run"),
        # from scratch, head_dim 32 (vLLM's CPU attention needs >= 32)
        "model": {"tokenizer": str(ARITH / "tokenizer"),
                  "config": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2,
                             "num_heads": 2, "num_kv_heads": 1, "max_position_embeddings": 64}},
        "data": {"sources": [{"path": str(data / "rl_prompts.jsonl"), "format": "prompt"}],
                 "eval": {"path": str(data / "eval.jsonl"), "format": "prompt"},
                 "batch_size": 4, "eval_batch_size": 16, "cache_dir": str(tmp_path / "cache")},
        "strategy": {"name": "grpo", "group_size": 4},
        "advantage": {"name": "grpo"},
        # a random policy rarely answers right: the format reward varies within groups, so
        # advantages are non-zero and the weights move from step to step
        "rewards": [{"name": "exact_match"}, {"name": "format_regex", "pattern": "^[0-9]"}],
        "sampler": {"name": "vllm", "temperature": 1.0, "max_new_tokens": 6, "seed": 0,
                    "stop_token_ids": [END_TOKEN], "enforce_eager": True, "max_num_seqs": 16,
                    "cpu_kv_cache_gib": 1},
        "device": {"name": "cpu"},
        # a large learning rate: the policy moves a lot between rollouts, so a missed
        # weight push would show as a large sampler/trainer log-prob difference
        "trainer": {"max_steps": STEPS, "lr": 1e-2, "schedule": "constant", "eval_every": STEPS,
                    "eval_at_start": False, "save_every": 0, "eval_max_new_tokens": 6,
                    "progress": False},
    }


def test_grpo_run_with_vllm_sampler_keeps_logprobs_in_agreement(tmp_path):
    import yaml

    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ARITH / "generate.py"), "--out", str(data), "--seed", "0",
                    "--n-train", "16", "--n-eval", "16", "--n-rl", "32"], check=True, capture_output=True)
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, data), sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(config)],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "rollout/logprob_diff_max" in row]
    assert [row["step"] for row in steps] == list(range(1, STEPS + 1))
    for row in steps:
        assert row["rollout/logprob_diff_max"] <= 1e-4, row
        assert row["rollout/logprob_diff_mean"] <= row["rollout/logprob_diff_max"]
    assert any("eval/accuracy" in row for row in rows)
    # The policy moved between rollouts and each rollout came from the newest weights,
    # so the agreement above needed every weight push.
    assert all(row["grad_norm"] > 0 for row in steps)
    assert [row["rollout/policy_version"] for row in steps] == list(range(STEPS))
    assert steps[-1]["entropy"] != pytest.approx(steps[0]["entropy"], abs=1e-3)
