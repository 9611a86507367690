"""The GSM8K recipe's GRPO and PPO configs run 2 steps on CPU: a tiny random Qwen3
(imported with `astrai import`) and a GSM8K-shaped parquet file written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astrai_core.testing import REPO_ROOT

RECIPE = REPO_ROOT / "examples" / "gsm8k"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")

pytestmark = pytest.mark.slow
datasets = pytest.importorskip("datasets")
pytest.importorskip("tensorboard")


def _astrai(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(RECIPE), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", *args], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """models/qwen3-tiny (native) and data/gsm8k/{train,test}.parquet."""
    from transformers import AutoTokenizer

    from astrai_core.testing.parity import save_hf_model, tiny_hf_model

    root = tmp_path_factory.mktemp("gsm8k")
    hf_dir = root / "hf"
    save_hf_model(tiny_hf_model("qwen3", max_position_embeddings=256), hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(hf_dir)
    _astrai("import", str(hf_dir), str(root / "models" / "qwen3-tiny"), cwd=root)
    rows = [{"question": f"w{i} has w{i + 1} apples. How many?",
             "answer": f"w{i} plus w{i + 1}.\n#### {i + 1}"} for i in range(12)]
    (root / "data" / "gsm8k").mkdir(parents=True)
    datasets.Dataset.from_list(rows[:8]).to_parquet(str(root / "data/gsm8k/train.parquet"))
    datasets.Dataset.from_list(rows[8:]).to_parquet(str(root / "data/gsm8k/test.parquet"))
    return root


@pytest.mark.parametrize("recipe", ["grpo.yaml", "ppo.yaml"])
def test_the_recipe_runs_two_steps_on_a_tiny_qwen3(workspace, recipe):
    config = yaml.safe_load((RECIPE / recipe).read_text())
    config["output_dir"] = f"runs/{recipe}"
    config["model"] = {"path": "models/qwen3-tiny", "dtype": "float32"}
    config["data"].update(batch_size=2, eval_batch_size=4, max_prompt_len=64,
                          cache_dir="cache")
    config["sampler"]["max_new_tokens"] = 6
    config["device"] = {"name": "cpu"}
    config["trainer"].update(max_steps=2, warmup_steps=0, mixed_precision="no", eval_every=0,
                             save_every=0, keep_last=None, eval_max_new_tokens=6,
                             progress=False)
    path = workspace / f"smoke-{recipe}"
    path.write_text(yaml.safe_dump(config))
    _astrai("train", str(path), cwd=workspace)
    run = workspace / "runs" / recipe
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert {"eval/accuracy", "eval/reward/gsm8k"} <= set(records[-1])
    assert "rollout/reward/gsm8k" in records[-1]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "checkpoints" / "step_2" / "model.safetensors").is_file()
