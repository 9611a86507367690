"""A push from FSDP2 shards hands vLLM exactly what a one-process push hands it: the same
Hugging Face names and the same tensors, bit for bit, for tied and untied heads, a LoRA
policy (merged) and an MoE policy, with every tensor in a bucket of its own; ``push: delta``
from the shards leaves the engine's copy equal to the changed policy's tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

WORKER = Path(__file__).with_name("sharded_push_worker.py")


def test_sharded_push_equals_the_unsharded_push(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(WORKER), str(tmp_path)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert sorted(results) == ["lora", "moe", "tied", "untied"]
        for case, checks in results.items():
            assert checks["sharded"], case  # the policy really was sharded
            assert checks["names"] and checks["unique"] and checks["equal"], (case, checks)
            assert checks["delta_equal"] and checks["delta_smaller"], (case, checks)
        # a tied head travels once, as the embedding
        assert results["tied"]["count"] == results["untied"]["count"] - 1
