"""What `astrai list-plugins` and a run config say about the vllm sampler, with and without vLLM.

These run in both environments: the main venv (no vLLM: the plugin is listed with its
install hint, and choosing the sampler fails before any work) and `make test-vllm`'s.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from astrai_core.testing import run_astrai

HAS_VLLM = importlib.util.find_spec("vllm") is not None
REPO = Path(__file__).resolve().parents[3]
HINT = "vLLM is not installed: pip install vllm"


def _astrai(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_astrai(*args, cwd=cwd, timeout=300)


def test_list_plugins_reports_vllm_without_importing_torch():
    result = _astrai("list-plugins", "--json")
    assert result.returncode == 0, result.stderr
    assert "TORCH_NOT_IMPORTED" in result.stderr
    entry = {e["name"]: e for e in json.loads(result.stdout)}["vllm"]
    if HAS_VLLM:
        assert entry["status"] == "ok" and entry["provides"] == {"sampler": ["vllm"]}, entry
    else:
        assert entry["status"] == "error" and HINT in entry["error"], entry
        table = _astrai("list-plugins")
        assert table.returncode == 0 and "vLLM is not installed" in " ".join(table.stdout.split())


@pytest.mark.skipif(HAS_VLLM, reason="checks the environment without vLLM")
def test_choosing_vllm_without_vllm_fails_before_any_work(tmp_path):
    import yaml

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1="}], "answer": "2"}) + "\n")
    config = {
        "output_dir": str(tmp_path / "run"),
        "model": {"tokenizer": str(REPO / "examples" / "arith" / "tokenizer"),
                  "config": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1,
                             "num_heads": 2, "num_kv_heads": 1, "max_position_embeddings": 64}},
        "data": {"sources": [{"path": str(prompts), "format": "prompt"}], "batch_size": 1},
        "strategy": {"name": "grpo", "group_size": 2},
        "rewards": [{"name": "exact_match"}],
        "sampler": {"name": "vllm", "max_new_tokens": 4},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 2},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    message = " ".join(result.stderr.split())
    assert "sampler.name" in message and HINT in message, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()
