"""bench/bench_tinker.py does not rot: at tiny sizes, the SDK against the in-process
server and the engine called directly both step, and both ratios are printed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from astrai_core.testing import REPO_ROOT

pytest.importorskip("tinker")


def test_the_bench_runs_and_reports_both_ratios():
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "bench_tinker.py"), "--hidden", "64",
         "--layers", "1", "--vocab", "128", "--rows", "2", "--seq", "16", "--rank", "2",
         "--steps", "2", "--warmup", "1", "--rounds", "1", "--tenants", "2"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["api_ratio"] == report["overhead"]["sdk"] / report["overhead"]["direct"] > 0
    steps = report["tenant_step"]
    assert report["tenant_ratio"] == steps["together"] / steps["alone"] > 0
    assert "SDK step / in-process engine step = " in done.stdout
    assert "2 tenants per-tenant step / 1 alone = " in done.stdout
