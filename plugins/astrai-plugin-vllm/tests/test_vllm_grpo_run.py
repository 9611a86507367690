"""An online GRPO run of the arithmetic example with `sampler: {name: vllm}`, end to end."""

from __future__ import annotations

import json
import re
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


def _train(tmp_path: Path, edit=None, before_main: str = "") -> subprocess.CompletedProcess:
    """`astrai train` on the config (changed by ``edit``), in a fresh interpreter that first
    runs ``before_main``."""
    import yaml

    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ARITH / "generate.py"), "--out", str(data), "--seed", "0",
                    "--n-train", "16", "--n-eval", "16", "--n-rl", "32"], check=True, capture_output=True)
    config = _config(tmp_path, data)
    if edit is not None:
        edit(config)
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    program = f"{before_main}\nfrom astrai_core.cli.main import main\nmain(['train', {str(path)!r}])"
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)


def test_grpo_run_with_vllm_sampler_keeps_logprobs_in_agreement(tmp_path):
    result = _train(tmp_path)
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


# A checked run of the arithmetic example's own shape: its head is tied to its embedding.
LIMIT = 1e-3  # the documented threshold for the vllm sampler on CPU in float32
CHECKED_STEPS = 3


def _checked(config: dict) -> None:
    config["model"]["config"]["tie_word_embeddings"] = True
    config["rollout"] = {"max_logprob_diff": LIMIT}
    config["trainer"].update(max_steps=CHECKED_STEPS, eval_every=0)
    config["data"].pop("eval")


def test_checked_grpo_run_with_a_tied_head_runs_through(tmp_path):
    result = _train(tmp_path, _checked)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, CHECKED_STEPS + 1))
    assert all(row["rollout/logprob_diff_max"] <= LIMIT for row in rows), rows


LOST_PUSH = """
from astrai_plugin_vllm.sampler import VllmSampler

def lost_push(self, state_dict=None):  # the version moves on, the engine keeps its weights
    self.policy_version += 1
    return self.policy_version

VllmSampler.update_weights = lost_push
"""


def test_a_push_that_does_not_land_stops_the_checked_run(tmp_path):
    result = _train(tmp_path, _checked, before_main=LOST_PUSH)
    assert result.returncode == 3, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-4000:]
    match = re.match(r"error: sampler 'vllm' disagrees with the trainer at step 2: its log-probs "
                     r"differ by up to (\S+) \(rollout.max_logprob_diff: 0.001\)", errors[0])
    assert match, errors[0]
    assert float(match.group(1)) > 10 * LIMIT
    assert "Traceback" not in result.stderr
