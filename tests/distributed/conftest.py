"""Helpers of the distributed tests: runs of 1 and 2 CPU processes (gloo), launched the
way a user launches them (`astrai train CONFIG [--nproc-per-node 2]`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from tests.training.conftest import write_config

TIMING = ("time/step_seconds", "throughput/tokens_per_s")
TIMEOUT = 420  # a hung run fails the test instead of hanging the suite


def train(config: dict, tmp_path: Path, name: str, nproc: int = 1, *extra: str,
          env: dict[str, str] | None = None, command: list[str] | None = None
          ) -> subprocess.CompletedProcess:
    """`astrai train` of ``config`` (written to ``tmp_path/name.yaml``) on ``nproc``
    processes, one CPU thread each; ``command`` replaces ``python -m astrai_core.cli.main``
    (the test kit's fault driver)."""
    path = write_config(tmp_path, config, f"{name}.yaml")
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    command = command or [sys.executable, "-m", "astrai_core.cli.main"]
    return subprocess.run([*command, "--log-format", "json",
                           "train", str(path), *launch, *extra], capture_output=True, text=True,
                          timeout=TIMEOUT, env=full_env)


def ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-4000:]


def weights(run_dir: Path, step: int, name: str = "model") -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "checkpoints" / f"step_{step}" / f"{name}.safetensors"))


def adapter(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapter tensors (PEFT's Hugging Face names)."""
    from astrai_core.checkpoints.lora_files import ADAPTER_DIR, ADAPTER_WEIGHTS

    return load_file(str(Path(run_dir) / "checkpoints" / f"step_{step}" / ADAPTER_DIR /
                         ADAPTER_WEIGHTS))


def without_timing(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in TIMING}


def assert_close_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        diff = (a[name].double() - b[name].double()).abs().max().item()
        assert diff <= atol, f"{name}: max |diff| {diff}"


def assert_close_metrics(a: list[dict], b: list[dict], names: tuple[str, ...],
                         rtol: float = 1e-5) -> None:
    """The same steps, and each named metric within ``rtol`` (relative)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        for name in names:
            u, v = x[name], y[name]
            assert abs(u - v) <= rtol * max(abs(u), abs(v), 1e-8) + 1e-7, \
                f"step {x['step']} {name}: {u} vs {v}"


def run_torchrun(script: Path, *args: str, nproc: int = 2) -> None:
    """``script`` on ``nproc`` processes under torch.distributed.run (a worker that checks
    sharded code against an unsharded copy in the same process)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the same imports
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(script), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def copy_checkpoint(source: Path, target: Path, step: int) -> None:
    """A run directory holding only ``source``'s checkpoint ``step`` and its metrics, as
    if the run had stopped there."""
    shutil.copytree(source / "checkpoints" / f"step_{step}",
                    target / "checkpoints" / f"step_{step}")
    shutil.copy2(source / "metrics.jsonl", target / "metrics.jsonl")


def assert_moe_two_processes_equal_one(base: dict, tmp_path: Path, steps: int) -> None:
    """An MoE run of ``base`` (aux loss coefficient 0.5, large enough to move the router
    visibly) on 2 processes equals the 1-process run: loss, aux loss, weights."""
    from astrai_core.testing import read_metrics

    base["strategy"]["aux_loss_coef"] = 0.5
    for name, nproc in (("one", 1), ("two", 2)):
        ok(train(dict(base, output_dir=str(tmp_path / name)), tmp_path, name, nproc))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert len(two) == steps and all(m["moe/aux_loss"] > 0 for m in two)
    assert_close_metrics(one, two, ("loss", "lm_loss", "moe/aux_loss", "grad_norm"))
    assert_close_weights(weights(tmp_path / "one", steps), weights(tmp_path / "two", steps))
