"""The README's quick start, run exactly as written.

The commands are read from README.md itself (the ```bash block after the
``<!-- quickstart`` marker), so the README and what works can never drift apart. They run
unchanged, in order, under ``bash -e`` in a fresh directory holding a copy of
``examples/`` (everything the commands read), with this interpreter's venv first on PATH
— the state the README's setup block (``make venv`` and activating ``.venv``) leaves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = "<!-- quickstart"


def _blocks_after(text: str, marker: str) -> str:
    match = re.search(re.escape(marker) + r".*?-->\s*```bash\n(.*?)```", text, flags=re.DOTALL)
    assert match, f"README.md has no ```bash block after {marker!r}"
    return match.group(1)


def _setup_block(text: str) -> list[str]:
    before = text[: text.index(MARKER)]
    block = re.findall(r"```bash\n(.*?)```", before, flags=re.DOTALL)[-1]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_setup_block_is_what_the_test_environment_reproduces():
    # The test stands in for these two lines by putting this venv's bin/ first on PATH.
    assert _setup_block(README.read_text()) == ["make venv", "source .venv/bin/activate"]
    assert "venv:" in (REPO / "Makefile").read_text()
    assert (Path(sys.executable).parent / "astrai").exists(), "the venv has no astrai script"


@pytest.mark.slow
def test_quickstart_commands_run_as_written(tmp_path):
    script = _blocks_after(README.read_text(), MARKER)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               COLUMNS="200")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    data = tmp_path / "runs" / "demo" / "data"
    for name, rows in (("sft_train.jsonl", 20000), ("eval.jsonl", 500), ("rl_prompts.jsonl", 5000)):
        assert len((data / name).read_text().splitlines()) == rows
        assert f"wrote runs/demo/data/{name} ({rows} " in result.stdout  # generate.py says so
    assert re.search(r"│ ppo\s+│ [\d.]+\s+│ ok", result.stdout), "list-plugins shows ppo ok"

    run = tmp_path / "runs" / "quickstart"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 60 and "eval/accuracy" in records[-1]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 1.0, "the quick-start model learns"
    assert (run / "checkpoints" / "step_60" / "model.safetensors").is_file()
    assert sorted(p.suffix for p in (run / "plots").iterdir()) and all(
        p.suffix == ".png" for p in (run / "plots").iterdir())
