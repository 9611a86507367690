"""bench/bench_long_context.py does not rot: a tiny group through its three ways prints
its ratio, and the shared way computes the prompt once."""

from __future__ import annotations

import json
import subprocess
import sys

from astrai_core.testing import REPO_ROOT


def test_the_bench_runs_and_reports_its_ratio():
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "bench_long_context.py"), "--prompt", "24",
         "--group", "3", "--completion", "5", "--layers", "1", "--repeats", "1",
         "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["tokens"] == {"padded": 87, "packed": 87, "shared": 39}
    assert report["ratio_vs_packed"] > 0
    assert "share_prompt step time / packed" in done.stdout
