"""The parts of ``make gpu-check`` (bench/gpu_check.py): what each runs, its time budget,
when it is skipped, and which numbers it reads back from its output.

A part's ``plan`` returns its command, or the reason it is skipped; its ``read`` gets
the exit status and the output and returns (status, reason, numbers).
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
GIB = 2**30
# Qwen3-4B trained with AdamW: float32 weights, gradients and two moments, and the
# temporary copy of a moment that torch's multi-tensor step makes (20 bytes a parameter),
# plus the activations of a checkpointed batch of 2 x 2048 and the logits. With Muon the
# hidden matrices keep one momentum (12 bytes a parameter, AdamW's for the embedding).
QWEN3_4B_ADAMW_GIB = 4.02e9 * 20 / GIB + 6
QWEN3_4B_MUON_GIB = 4.02e9 * 12 / GIB + 0.39e9 * 8 / GIB + 8


@dataclass
class Context:
    """What every part is planned with."""

    python: str              # the project's interpreter
    vllm_python: str         # the interpreter that has vLLM (a GPU build)
    out: Path                # the report's directory: each part's files go here
    backend: str             # the device backend's name: cuda, npu, ... (cpu: none)
    device: dict[str, Any]   # its name, memory, peak


@dataclass
class Part:
    name: str
    budget_s: int
    summary: str
    plan: Callable[[Context], list[str] | str]
    read: Callable[[Context, int, str], tuple[str, str, dict[str, Any]]]


def _needs_accelerator(ctx: Context) -> str | None:
    if ctx.backend == "cpu":
        return "no accelerator: the device backend `auto` resolved to cpu"
    return None


# -- pytest -m gpu ------------------------------------------------------------------
def plan_gpu_tests(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
            "-o", "addopts=--import-mode=importlib -rs"]


def read_gpu_tests(ctx: Context, code: int, output: str) -> tuple[str, str, dict[str, Any]]:
    counts = {kind: 0 for kind in ("passed", "failed", "skipped", "errors", "deselected")}
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    for number, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary):
        counts["errors" if kind.startswith("error") else kind] = int(number)
    if code == 5:
        return "skipped", "no test is marked gpu", counts
    if code != 0:
        return "failed", f"pytest exit {code}: {summary}", counts
    if counts["passed"] == 0:
        reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.+)", output)))
        return "skipped", "every gpu test skipped: " + "; ".join(reasons or ["see the log"]), counts
    return "passed", summary, counts


# -- bench/bench_mfu.py ---------------------------------------------------------------
MFU_KEYS = ("device", "parameters", "batch_per_rank", "seq", "optimizer", "step_seconds",
            "tokens_per_second", "achieved_tflops", "peak_tflops_per_device", "mfu",
            "final_loss", "time_ratio")


def plan_mfu(shape: str, batch: int, checkpointing: bool) -> Callable[[Context], list[str] | str]:
    def plan(ctx: Context) -> list[str] | str:
        if (reason := _needs_accelerator(ctx)) is not None:
            return reason
        optimizer = _optimizer_that_fits(shape, ctx.device.get("memory_gib"))
        if optimizer.startswith("skip: "):
            return optimizer[len("skip: "):]
        command = [ctx.python, str(BENCH / "bench_mfu.py"), "--device", ctx.backend,
                   "--shape", shape, "--batch", str(batch), "--seq", "2048", "--steps", "10",
                   "--warmup", "3", "--optimizer", optimizer,
                   "--json", str(ctx.out / f"mfu_{shape}.json")]
        # the peer's parameter names differ, so Muon would not pick the same matrices
        command += ["--peer", "transformers"] if optimizer == "adamw" else []
        return command + (["--activation-checkpointing"] if checkpointing else [])
    return plan


def _optimizer_that_fits(shape: str, memory_gib: float | None) -> str:
    """adamw, muon where only it fits (the Qwen3-4B shape), or "skip: <why>"."""
    if shape != "qwen3-4b" or memory_gib is None or memory_gib >= QWEN3_4B_ADAMW_GIB:
        return "adamw"
    if memory_gib >= QWEN3_4B_MUON_GIB:
        return "muon"
    return (f"skip: {memory_gib:.0f} GiB of device memory; training the Qwen3-4B shape "
            f"needs about {QWEN3_4B_MUON_GIB:.0f} GiB (Muon), {QWEN3_4B_ADAMW_GIB:.0f} (AdamW)")


def read_mfu(shape: str) -> Callable[[Context, int, str], tuple[str, str, dict[str, Any]]]:
    def read(ctx: Context, code: int, output: str) -> tuple[str, str, dict[str, Any]]:
        if code != 0:
            return "failed", f"exit {code}: {_last_line(output)}", {}
        result = json.loads((ctx.out / f"mfu_{shape}.json").read_text())
        numbers = {key: result.get(key) for key in MFU_KEYS}
        numbers["peak_allocated_gib"] = result["memory"].get("peak_allocated_bytes", 0) / GIB
        mfu = "unknown peak" if numbers["mfu"] is None else f"MFU {numbers['mfu']:.1%}"
        reason = f"{numbers['tokens_per_second']:,.0f} tokens/s, {mfu} ({numbers['optimizer']})"
        if "peer" in result:
            peer = result["peer"]
            numbers["peer"] = {key: peer.get(key) for key in ("name", "step_seconds",
                                                                "tokens_per_second", "mfu")}
            reason += f"; {numbers['time_ratio']:.2f}x the time of {peer['name']}"
        return "passed", reason, numbers
    return read


# -- 5 GRPO steps, colocated vLLM, sleep mode --------------------------------------------
VLLM_STEPS = 5


def plan_grpo_vllm(ctx: Context) -> list[str] | str:
    if (reason := _needs_accelerator(ctx)) is not None:
        return reason
    if not _has_vllm(ctx.vllm_python):
        return (f"vllm is not importable by {ctx.vllm_python}: install a vLLM build for "
                "this accelerator there, or name its interpreter with --vllm-python")
    config = _grpo_vllm_config(ctx)
    return [ctx.vllm_python, "-m", "astrai_core.cli.main", "train", str(config)]


def _has_vllm(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("vllm") is not None
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def _grpo_vllm_config(ctx: Context) -> Path:
    """A 5-step GRPO run: a 5M model from scratch, one engine in the trainer's process,
    asleep (KV cache freed, weights offloaded) while the trainer steps."""
    from astrai_core.testing import tiny_run_config, write_arith_prompts
    from bench_grpo_vllm import MODEL

    work = ctx.out / "grpo_vllm"
    work.mkdir(parents=True, exist_ok=True)
    prompts = write_arith_prompts(work / "prompts.jsonl", count=64)
    sampler = {"name": "vllm", "sleep": True, "max_new_tokens": 64, "stop_token_ids": [],
               "enforce_eager": True, "gpu_memory_utilization": 0.3}
    run = tiny_run_config(work, prompts, {"name": "grpo", "group_size": 8},
                          data={"batch_size": 8}, sampler=sampler, max_steps=VLLM_STEPS,
                          lr=1e-4, save_every=0)
    run["model"]["config"] = dict(MODEL)
    run["device"] = {"name": ctx.backend}
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def read_grpo_vllm(ctx: Context, code: int, output: str) -> tuple[str, str, dict[str, Any]]:
    if code != 0:
        return "failed", f"exit {code}: {_last_line(output)}", {}
    rows = [json.loads(line) for line in
            (ctx.out / "grpo_vllm" / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "time/step_seconds" in row]
    later = steps[1:] or steps
    numbers = {"steps": len(steps), "loss": [row.get("loss") for row in steps],
               "step_seconds_median": statistics.median(r["time/step_seconds"] for r in later)}
    pushes = [r["rollout/weight_push_seconds"] for r in later if "rollout/weight_push_seconds" in r]
    numbers["weight_push_seconds_median"] = statistics.median(pushes) if pushes else None
    if len(steps) != VLLM_STEPS:
        return "failed", f"{len(steps)} steps logged, {VLLM_STEPS} expected", numbers
    return "passed", f"{VLLM_STEPS} steps, {numbers['step_seconds_median']:.2f} s/step", numbers


# -- bench/bench_sampler.py and bench/bench_grpo_trl.py ------------------------------------
def plan_sampler(ctx: Context) -> list[str] | str:
    if (reason := _needs_accelerator(ctx)) is not None:
        return reason
    return [ctx.python, str(BENCH / "bench_sampler.py"), "--device", ctx.backend,
            "--size", "small", "--batch", "16", "--new-tokens", "64", "--repeats", "3",
            "--json", str(ctx.out / "sampler.json")]


def read_sampler(ctx: Context, code: int, output: str) -> tuple[str, str, dict[str, Any]]:
    if code != 0:
        return "failed", f"exit {code}: {_last_line(output)}", {}
    numbers = json.loads((ctx.out / "sampler.json").read_text())
    ratios = ", ".join(f"{label}: {figures['ratio']:.2f}x"
                       for label, figures in numbers["scenarios"].items())
    differ = [label for label, figures in numbers["scenarios"].items()
              if figures.get("identical_greedy_outputs") is False]
    # float32 on both, but other kernels than on a CPU: a near-tie may pick another token
    note = f"; greedy outputs differ from transformers' ({', '.join(differ)})" if differ else ""
    return "passed", f"astrai / transformers tokens/s: {ratios}{note}", numbers


def plan_grpo_trl(ctx: Context) -> list[str] | str:
    if (reason := _needs_accelerator(ctx)) is not None:
        return reason
    return [ctx.python, str(BENCH / "bench_grpo_trl.py"), "--device", ctx.backend,
            "--size", "small", "--steps", "4", "--rounds", "1",
            "--json", str(ctx.out / "grpo_trl.json")]


def read_grpo_trl(ctx: Context, code: int, output: str) -> tuple[str, str, dict[str, Any]]:
    if code != 0:
        return "failed", f"exit {code}: {_last_line(output)}", {}
    numbers = json.loads((ctx.out / "grpo_trl.json").read_text())
    return "passed", (f"astrai {numbers['astrai_median_seconds']:.3f} s/step, TRL "
                      f"{numbers['trl_median_seconds']:.3f} s/step: astrai / TRL time "
                      f"{numbers['time_ratio']:.2f}"), numbers


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(no output)"


# Budgets add up to 450 s: with the start-up, the check stays under 8 minutes.
PARTS = [
    Part("gpu_tests", 60, "pytest -m gpu", plan_gpu_tests, read_gpu_tests),
    Part("mfu_qwen3_0_6b", 70, "bench_mfu.py, Qwen3-0.6B shape, batch 8 x 2048, "
         "transformers peer", plan_mfu("qwen3-0.6b", 8, False), read_mfu("qwen3-0.6b")),
    Part("mfu_qwen3_4b", 90, "bench_mfu.py, Qwen3-4B shape, batch 2 x 2048, activation "
         "checkpointing, transformers peer (Muon, no peer, where AdamW does not fit)",
         plan_mfu("qwen3-4b", 2, True), read_mfu("qwen3-4b")),
    Part("grpo_vllm_sleep", 120, f"{VLLM_STEPS} GRPO steps, colocated vLLM, sampler.sleep",
         plan_grpo_vllm, read_grpo_vllm),
    Part("bench_sampler", 50, "bench_sampler.py, small model, batch 16 x 64 tokens",
         plan_sampler, read_sampler),
    Part("bench_grpo_trl", 60, "bench_grpo_trl.py, small model, 4 steps, 1 round",
         plan_grpo_trl, read_grpo_trl),
]
