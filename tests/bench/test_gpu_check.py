"""bench/gpu_check.py (`make gpu-check`): its dry run writes a report with every part, each
with a status and a reason; a part that fails or runs out of time is recorded and the
others still run; the parts read their numbers from what the benchmarks write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astrai_core.testing import REPO_ROOT

BENCH = REPO_ROOT / "bench"


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_check

    return gpu_check


def test_the_dry_run_reports_every_part_with_a_status_and_a_reason(tmp_path, gpu_check):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--dry-run",
                           "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 60
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] and report["dry_run"]
    assert report["backend"] and report["device"]["name"]
    assert list(report["parts"]) == [p.name for p in gpu_check.PARTS]
    for name, part in report["parts"].items():
        assert part["status"] == "skipped", name  # a dry run runs nothing
        assert part["reason"], name
        assert part["budget_seconds"] > 0 and isinstance(part["numbers"], dict)
    # the pytest part needs no accelerator: its command is in the report
    command = report["parts"]["gpu_tests"]["command"]
    assert command[command.index("-m", 2) + 1] == "gpu"
    assert not list(tmp_path.glob("*.tmp"))  # written aside, then renamed
    # the budgets fit the 8 minutes with room for the start-up
    assert sum(p.budget_s for p in gpu_check.PARTS) <= gpu_check.TOTAL_BUDGET_S <= 8 * 60 - 30


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive (a killed process not yet reaped, a zombie, is not)."""
    for _ in range(20):
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.1)
    return True


def _part(parts, name: str, code: str, budget: int = 30):
    def read(ctx, status, output):
        return ("passed" if status == 0 else "failed"), f"exit {status}: {output.strip()}", {
            "exit": status}
    return parts.Part(name, budget, name, lambda ctx: [sys.executable, "-c", code], read)


def test_a_failing_and_a_hanging_part_are_recorded_and_the_others_run(tmp_path, gpu_check,
                                                                      monkeypatch):
    import gpu_check_parts as parts

    marker = tmp_path / "grandchild.pid"
    # the hanging part starts a grandchild: the timeout kills the whole process group
    hang = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); "
            f"open({str(marker)!r}, 'w').write(str(child.pid)); time.sleep(60)")
    fake = [_part(parts, "fails", "import sys; print('boom'); sys.exit(3)"),
            _part(parts, "hangs", hang, budget=3),
            parts.Part("raises", 5, "raises", lambda ctx: 1 / 0, None),
            parts.Part("skips", 5, "skips", lambda ctx: "not here", None),
            _part(parts, "passes", "print('fine')")]
    monkeypatch.setattr(gpu_check, "detect_device", lambda name: ("cuda", {"name": "fake"}))
    args = gpu_check.argparse.Namespace(out=tmp_path, device="auto", vllm_python=None,
                                        budget=60.0, dry_run=False)
    report = gpu_check.check(args, fake)
    parts_ = report["parts"]
    assert parts_["fails"]["status"] == "failed" and parts_["fails"]["reason"] == "exit 3: boom"
    assert "boom" in parts_["fails"]["output_tail"]
    assert parts_["hangs"]["status"] == "failed"
    assert parts_["hangs"]["reason"].startswith("timed out after 3 s")
    assert parts_["hangs"]["seconds"] < 20
    assert not _running(int(marker.read_text()))  # killed with its parent, not left running
    assert parts_["raises"]["status"] == "failed" and "ZeroDivisionError" in parts_["raises"]["reason"]
    assert parts_["skips"] == {**parts_["skips"], "status": "skipped", "reason": "not here"}
    assert parts_["passes"]["status"] == "passed"
    assert json.loads((tmp_path / "report.json").read_text()) == report


def test_a_spent_budget_skips_the_remaining_parts(tmp_path, gpu_check, monkeypatch):
    import gpu_check_parts as parts

    monkeypatch.setattr(gpu_check, "detect_device", lambda name: ("cuda", {"name": "fake"}))
    args = gpu_check.argparse.Namespace(out=tmp_path, device="auto", vllm_python=None,
                                        budget=5.0, dry_run=False)
    report = gpu_check.check(args, [_part(parts, "first", "print(1)")])
    assert report["parts"]["first"] == {**report["parts"]["first"], "status": "skipped",
                                        "reason": "the check's time budget is spent"}


def test_pytest_summaries_are_read_into_counts_and_a_status(gpu_check):
    import gpu_check_parts as parts

    ctx = None
    status, reason, counts = parts.read_gpu_tests(ctx, 0, "....\n3 passed, 1 skipped in 2.0s\n")
    assert status == "passed" and counts["passed"] == 3 and counts["skipped"] == 1
    output = ("SKIPPED [2] tests/devices/test_cuda.py:66: needs a CUDA device\n"
              "2 skipped, 900 deselected in 9.0s\n")
    status, reason, counts = parts.read_gpu_tests(ctx, 0, output)
    assert status == "skipped" and reason == "every gpu test skipped: needs a CUDA device"
    assert counts["deselected"] == 900
    status, reason, counts = parts.read_gpu_tests(ctx, 1, "1 failed, 2 passed in 3s\n")
    assert status == "failed" and counts == {**counts, "failed": 1, "passed": 2}
    assert parts.read_gpu_tests(ctx, 5, "no tests ran")[0] == "skipped"


def test_the_parts_plan_for_the_device_they_find(tmp_path, gpu_check):
    import gpu_check_parts as parts

    def ctx(memory_gib: float, backend: str = "cuda") -> parts.Context:
        return parts.Context(python=sys.executable, vllm_python=sys.executable, out=tmp_path,
                             backend=backend, device={"name": "x", "memory_gib": memory_gib})
    by_name = {p.name: p for p in parts.PARTS}
    big = by_name["mfu_qwen3_4b"].plan(ctx(139.0))  # an H200: AdamW and the peer fit
    assert big[big.index("--shape") + 1] == "qwen3-4b" and big[big.index("--device") + 1] == "cuda"
    assert "--activation-checkpointing" in big and "--peer" in big
    assert big[big.index("--optimizer") + 1] == "adamw"
    h100 = by_name["mfu_qwen3_4b"].plan(ctx(79.1))  # AdamW's 81 GiB do not fit: Muon alone
    assert h100[h100.index("--optimizer") + 1] == "muon" and "--peer" not in h100
    assert "needs about 56 GiB (Muon), 81 (AdamW)" in by_name["mfu_qwen3_4b"].plan(ctx(32.0))
    small = by_name["mfu_qwen3_0_6b"].plan(ctx(32.0))
    assert small[small.index("--optimizer") + 1] == "adamw" and "--peer" in small
    npu = by_name["bench_sampler"].plan(ctx(64.0, backend="npu"))
    assert npu[npu.index("--device") + 1] == "npu"
    assert by_name["bench_grpo_trl"].plan(ctx(80.0, backend="cpu")).startswith("no accelerator")
    no_vllm = parts.Context(python=sys.executable, vllm_python=sys.executable, out=tmp_path,
                            backend="cuda", device={"name": "x"})
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert "vllm is not importable" in by_name["grpo_vllm_sleep"].plan(no_vllm)


def test_the_mfu_part_reads_the_benchmark_json(tmp_path, gpu_check, monkeypatch):
    import bench_mfu
    import gpu_check_parts as parts

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    bench_mfu.main(["--smoke", "--device", "cpu", "--peer", "transformers", "--peak-tflops",
                    "1.0", "--json", str(tmp_path / "mfu_qwen3-0.6b.json")])
    ctx = parts.Context(python=sys.executable, vllm_python=sys.executable, out=tmp_path,
                        backend="cuda", device={})
    status, reason, numbers = parts.read_mfu("qwen3-0.6b")(ctx, 0, "")
    written = json.loads((tmp_path / "mfu_qwen3-0.6b.json").read_text())
    assert status == "passed" and numbers["mfu"] == written["mfu"]
    assert numbers["peer"]["tokens_per_second"] == written["peer"]["tokens_per_second"]
    assert "Qwen3ForCausalLM" in reason
    assert parts.read_mfu("qwen3-0.6b")(ctx, 1, "CUDA out of memory\n")[:2] == (
        "failed", "exit 1: CUDA out of memory")


def test_the_vllm_part_writes_a_valid_five_step_sleep_mode_config(tmp_path, gpu_check):
    import gpu_check_parts as parts

    from astrai_core.config import load_config

    ctx = parts.Context(python=sys.executable, vllm_python=sys.executable, out=tmp_path,
                        backend="cuda", device={"name": "x"})
    config = load_config(parts._grpo_vllm_config(ctx))
    assert config.sampler.name == "vllm" and config.sampler.params["sleep"] is True
    # every option is one the vllm sampler takes (its Config forbids others)
    from astrai_plugin_vllm.sampler import VllmSampler  # importable without vLLM itself

    assert VllmSampler.Config(**config.sampler.params).sleep is True
    assert config.trainer.max_steps == parts.VLLM_STEPS == 5
    assert config.device.name == "cuda" and config.strategy.name == "grpo"


def test_the_sampler_part_reads_the_benchmark_figures(tmp_path, gpu_check):
    import bench_sampler
    import gpu_check_parts as parts

    same = [[1, 2, 3]]
    figures = {"device": "cuda:0", "scenarios": {
        "greedy": bench_sampler.report("greedy", {"transformers": ([2.0], same),
                                                  "astrai": ([1.0], same)}, sample=False),
        "stop": bench_sampler.report("stop", {"transformers": ([1.0], same),
                                              "astrai": ([1.0], [[1, 2, 4]])}, sample=False)}}
    (tmp_path / "sampler.json").write_text(json.dumps(figures))
    ctx = parts.Context(python=sys.executable, vllm_python=sys.executable, out=tmp_path,
                        backend="cuda", device={})
    status, reason, numbers = parts.read_sampler(ctx, 0, "")
    assert status == "passed" and numbers["scenarios"]["greedy"]["ratio"] == 2.0
    assert reason == ("astrai / transformers tokens/s: greedy: 2.00x, stop: 1.00x; greedy "
                      "outputs differ from transformers' (stop)")
