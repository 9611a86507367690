"""`make gpu-check`: one prepared check on a machine with an accelerator (CUDA or NPU),
under 8 minutes, that writes one JSON report.

Each part (bench/gpu_check_parts.py: the gpu-marked tests, training MFU of the Qwen3-0.6B
and Qwen3-4B shapes against transformers, 5 GRPO steps with colocated vLLM asleep between
rollouts, the sampler and GRPO-against-TRL benchmarks) runs in its own process group with
its own time budget; it is recorded as passed, failed or skipped, with a reason and its
numbers, and one part failing or timing out does not stop the others. The report is
rewritten after every part (``"complete": false`` until the last), aside then renamed.

    .venv/bin/python bench/gpu_check.py [--out runs/gpu-check] [--device auto]
        [--vllm-python PATH] [--only PART ...] [--dry-run]

``--dry-run`` runs nothing: every part is recorded as skipped with the command it would
run (or the reason it would be skipped), in a few seconds, on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the parts, bench_mfu's peak table
from gpu_check_parts import GIB, PARTS, REPO, Context, Part  # noqa: E402

TOTAL_BUDGET_S = 450  # the parts together; with the start-up the check stays under 8 minutes
STATUSES = ("passed", "failed", "skipped")


def detect_device(name: str) -> tuple[str, dict[str, Any]]:
    """The device backend ``name`` resolves to, and its device's name, memory and peak."""
    import torch

    from astrai_core.devices.select import resolve_device
    from astrai_core.plugins import process_registry
    from bench_mfu import device_name, peak_tflops

    backend = resolve_device(process_registry(), name)
    if backend.type == "cpu":
        return backend.name, {"name": "cpu"}
    device = backend.device(0)
    label = device_name(device)
    total = torch.get_device_module(device.type).get_device_properties(device).total_memory
    return backend.name, {"name": label, "count": backend.device_count(),
                          "memory_gib": total / GIB, "peak_bf16_tflops": peak_tflops(label)}


def run_part(part: Part, ctx: Context, deadline: float, dry_run: bool) -> dict[str, Any]:
    """One part's record; never raises (a part's own error is its failure)."""
    record: dict[str, Any] = {"summary": part.summary, "budget_seconds": part.budget_s,
                              "seconds": 0.0, "numbers": {}}
    try:
        planned = part.plan(ctx)
    except Exception as error:  # noqa: BLE001 - recorded, the other parts go on
        return {**record, "status": "failed", "reason": f"planning failed: {error!r}"}
    if isinstance(planned, str):
        return {**record, "status": "skipped", "reason": planned}
    record["command"] = planned
    left = deadline - time.monotonic()
    if dry_run:
        return {**record, "status": "skipped", "reason": "dry run: the command was not run"}
    if left < 10:
        return {**record, "status": "skipped", "reason": "the check's time budget is spent"}
    log = ctx.out / f"{part.name}.log"
    record["log"] = str(log)
    start = time.monotonic()
    code = _run(planned, log, min(part.budget_s, left))
    record["seconds"] = round(time.monotonic() - start, 1)
    output = log.read_text(errors="replace")
    if code is None:
        return {**record, "status": "failed", "output_tail": output[-2000:],
                "reason": f"timed out after {min(part.budget_s, left):.0f} s (its budget)"}
    try:
        status, reason, numbers = part.read(ctx, code, output)
    except Exception as error:  # noqa: BLE001 - e.g. a missing or malformed result file
        status, reason, numbers = "failed", f"its result could not be read: {error!r}", {}
    record.update(status=status, reason=reason, numbers=numbers)
    if status == "failed":
        record["output_tail"] = output[-2000:]
    return record


def _run(command: list[str], log: Path, timeout: float) -> int | None:
    """Exit status of ``command`` (output to ``log``); None when it ran out of time, its
    whole process group (torchrun, vLLM's workers) then killed."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                   start_new_session=True, env=_child_env())
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None


def _child_env() -> dict[str, str]:
    """This process's environment, with the repository's packages importable."""
    paths = [p for p in sys.path if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Aside, then renamed: a reader never sees half a report."""
    aside = path.with_suffix(".json.tmp")
    aside.write_text(json.dumps(report, indent=2))
    os.replace(aside, path)


def check(args: argparse.Namespace, parts: list[Part]) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.budget
    backend, device = detect_device(args.device)
    ctx = Context(python=sys.executable, vllm_python=args.vllm_python or sys.executable,
                  out=args.out.resolve(), backend=backend, device=device)
    report: dict[str, Any] = {
        "complete": False, "dry_run": args.dry_run, "date": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget_seconds": args.budget,
        "backend": backend, "device": device, "python": sys.executable, "parts": {}}
    path = args.out / "report.json"
    for part in parts:
        print(f"gpu-check: {part.name} ({part.summary})", flush=True)
        record = run_part(part, ctx, deadline, args.dry_run)
        report["parts"][part.name] = record
        report["seconds"] = round(time.monotonic() - started, 1)
        write_report(path, report)
        print(f"  {record['status']}: {record['reason']}", flush=True)
    report["complete"] = True
    write_report(path, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "gpu-check",
                        help="the report (report.json) and each part's log and files")
    parser.add_argument("--device", default="auto", help="device backend name")
    parser.add_argument("--vllm-python", default=None,
                        help="an interpreter with a vLLM build for this accelerator "
                             "(default: this one)")
    parser.add_argument("--only", nargs="+", choices=[p.name for p in PARTS], default=None,
                        help="run these parts only")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S,
                        help="seconds for all parts together")
    parser.add_argument("--dry-run", action="store_true",
                        help="run nothing: record each part's command or skip reason")
    args = parser.parse_args(argv)
    parts = [p for p in PARTS if args.only is None or p.name in args.only]
    report = check(args, parts)
    failed = [name for name, record in report["parts"].items() if record["status"] == "failed"]
    print(f"gpu-check: report in {args.out / 'report.json'}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
