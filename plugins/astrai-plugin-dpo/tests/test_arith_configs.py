"""The arithmetic example's kto, orpo and simpo configs run as written for two steps, with
the demo's data (generate.py) and a tiny from-scratch model in place of the SFT checkpoint."""

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


@pytest.mark.parametrize("name", ["kto", "orpo", "simpo"])
def test_example_config_runs_two_steps(tmp_path, name):
    subprocess.run([sys.executable, str(EXAMPLE / "generate.py"), "--out",
                    str(tmp_path / "runs/demo/data"), "--n-train", "10", "--n-eval", "8",
                    "--n-rl", "32", "--n-unpaired", "64"], check=True, capture_output=True)
    config = yaml.safe_load((EXAMPLE / f"{name}.yaml").read_text())
    config["model"] = {"tokenizer": str(ARITH_TOKENIZER), "config": dict(TINY_MODEL)}
    config["data"]["eval_batch_size"] = 8
    config["data"]["cache_dir"] = str(tmp_path / "cache")
    config["trainer"].update(max_steps=2, eval_every=2, progress=False)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    # the config's relative paths (data, output) resolve against the working directory
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        train(load_config(path))
    metrics = read_metrics(tmp_path / config["output_dir"])
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]
    assert any("eval/accuracy" in m for m in metrics)
