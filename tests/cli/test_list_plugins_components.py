"""`astrai list-plugins`: component summaries (verbose table and JSON), the reason a plugin
is not ok, and a closed pipe handled quietly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from astrai_core.plugins import load_plugins
from astrai_core.plugins.specs import KINDS
from astrai_core.testing import CLI_PROBE, run_astrai

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _registry_summaries() -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, name) -> (distribution, summary), straight from the registry."""
    registry = load_plugins()
    return {(spec.kind, spec.name): (registry.provider(spec.kind, spec.name).distribution,
                                     spec.summary)
            for kind in KINDS
            for spec in registry.specs(kind)}


def test_json_components_carry_every_summary_and_match_provides():
    result = run_astrai("list-plugins", "--all", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "TORCH_NOT_IMPORTED" in result.stderr
    expected = _registry_summaries()
    seen = {}
    for entry in json.loads(result.stdout):
        assert {"name", "version", "status", "error", "provides", "components"} <= set(entry)
        names = {kind: sorted(c["name"] for c in items)
                 for kind, items in entry["components"].items()}
        assert names == entry["provides"], entry
        for kind, items in entry["components"].items():
            for item in items:
                seen[(kind, item["name"])] = (entry["distribution"], item["summary"])
    assert seen == expected
    assert seen[("strategy", "ppo")][1].startswith("PPO")
    assert {name for kind, name in seen if kind == "policy_loss"} >= {
        "ppo_clip", "dual_clip", "gspo", "cispo"}


def test_verbose_table_shows_one_row_per_component_with_its_summary(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one line per row, whatever the caller's terminal
    result = run_astrai("list-plugins", "-v", "--all", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "TORCH_NOT_IMPORTED" in result.stderr
    lines = result.stdout.splitlines()
    for (kind, name), (_, summary) in _registry_summaries().items():
        row = [line for line in lines if f" {name} " in line and f" {kind} " in line]
        assert row, f"no row for {kind} {name}"
        assert summary[:40] in " ".join(row[0].split()), (row, summary)


def test_a_plugin_in_error_says_why_in_the_table(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    result = run_astrai("list-plugins", timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    if HAS_VLLM:
        assert "not loaded" not in text
    else:
        assert "vllm │ 0.1.0 │ error │ not loaded: vLLM is not installed: pip install vllm" in text
        assert "skipped and breaks nothing else" in text


def test_closed_pipe_ends_quietly():
    # The reader is gone before the command writes (what `| head -1` leads to for long output).
    read_end, write_end = os.pipe()
    os.close(read_end)
    process = subprocess.run([sys.executable, "-c", CLI_PROBE, "list-plugins", "--json"],
                             stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert "Traceback" not in process.stderr and "BrokenPipe" not in process.stderr, process.stderr
    assert process.returncode == 141
