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


def test_the_longest_row_search_reports_both_lengths():
    """A cap a few hundred MiB above a 1-layer model's gradients: rows of a few thousand
    tokens, the search doubling then bisecting for 1 and 2 processes."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "bench_long_context.py"), "--case",
         "longest-row", "--cap-gib", "0.45", "--granularity", "1024", "--layers", "1"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["longest"]["1"] >= 1024 and report["longest"]["2"] >= 1024
    assert report["ratio"] == report["longest"]["2"] / report["longest"]["1"]
