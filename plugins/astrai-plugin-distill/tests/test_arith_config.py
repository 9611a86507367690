"""examples/arith/distill.yaml runs as written for two steps, with the demo's data
(generate.py), a tiny teacher in place of the DPO checkpoint and a tiny student."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from astrai_core.config.loader import load_config
from astrai_core.testing import ARITH_TOKENIZER, REPO_ROOT, TINY_MODEL, read_metrics
from astrai_core.training.run import train

EXAMPLE = REPO_ROOT / "examples" / "arith"
if not (EXAMPLE / "generate.py").is_file():  # an installed wheel: no examples to run
    pytest.skip("needs a source checkout with examples/arith", allow_module_level=True)


def test_distill_example_runs_two_steps(tmp_path, teacher):
    subprocess.run([sys.executable, str(EXAMPLE / "generate.py"), "--out",
                    str(tmp_path / "runs/demo/data"), "--n-train", "128", "--n-eval", "8",
                    "--n-rl", "8"], check=True, capture_output=True)
    config = yaml.safe_load((EXAMPLE / "distill.yaml").read_text())
    assert config["strategy"]["teacher_correct_only"] and config["strategy"]["sft_coef"] > 0
    config["strategy"]["teacher"] = str(teacher)
    config["model"] = {"tokenizer": str(ARITH_TOKENIZER), "config": dict(TINY_MODEL)}
    config["data"].update(eval_batch_size=8, cache_dir=str(tmp_path / "cache"))
    config["trainer"].update(max_steps=2, warmup_steps=1, eval_every=2, progress=False)
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patch:  # relative paths resolve against the cwd
        patch.chdir(tmp_path)
        train(load_config(path))
    metrics = read_metrics(tmp_path / config["output_dir"])
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all("sft_nll" in m and "distill/teacher_correct_rows" in m for m in steps)
    assert any("eval/accuracy" in m for m in metrics)
