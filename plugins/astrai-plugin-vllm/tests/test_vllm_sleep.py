"""`sampler.sleep: true` on a platform where vLLM has no sleep mode (its CPU backend):
the run stops at start with one error line naming the field, before any step."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from astrai_core.testing import tiny_run_config, write_arith_prompts  # noqa: E402


def test_sleep_on_cpu_stops_the_run_with_one_line(tmp_path):
    import yaml

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=4)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             data={"batch_size": 2},
                             sampler={"name": "vllm", "sleep": True, "enforce_eager": True},
                             max_steps=1)
    config["model"]["config"].update(hidden_size=64, num_heads=2, num_kv_heads=1)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: sampler.sleep: vLLM has no sleep mode on this platform (cpu); "
                      "leave sleep off"], result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
