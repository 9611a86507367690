"""In a 2-process run only rank 0 reports: its tracker gets every step of metrics.jsonl,
and no other rank starts one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from astrai_core.testing import ARITH_TOKENIZER, TINY_MODEL, write_arith_prompts

from .readers import jsonl_series

pytestmark = pytest.mark.slow  # 2 processes under torchrun

PLUGIN = '''
import json, os
from astrai_core import TrackerSpec, hookimpl


class Recorder:
    requires = ()
    install = ""

    def __init__(self):
        self.path = os.path.join(os.environ["RECORDER_DIR"], f"rank{os.environ.get('RANK', '0')}.jsonl")

    def _write(self, record):
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\\n")

    def start(self, run):
        self._write({"start": run.config["output_dir"]})

    def log(self, metrics, step):
        self._write({"step": step, **metrics})

    def close(self, status):
        self._write({"close": status})


@hookimpl
def astrai_trackers():
    return [TrackerSpec(name="rank_recorder", target="rank_recorder_plugin:Recorder",
                        summary="records per rank")]
'''


def test_only_rank_zero_reports(tmp_path):
    (tmp_path / "rank_recorder_plugin.py").write_text(PLUGIN)
    (tmp_path / "records").mkdir()
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = {
        "output_dir": str(tmp_path / "run"),
        "model": {"tokenizer": str(ARITH_TOKENIZER), "config": dict(TINY_MODEL)},
        "data": {"sources": [{"path": str(prompts), "format": "prompt"}], "batch_size": 4,
                 "cache_dir": str(tmp_path / "cache")},
        "strategy": {"name": "grpo", "group_size": 2},
        "rewards": [{"name": "format_regex", "pattern": "[0-9]"}],
        "sampler": {"name": "torch", "max_new_tokens": 3, "seed": 0},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 2, "eval_at_start": False, "progress": False,
                    "report_to": ["rank_recorder"]},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ASTRAI_PLUGINS": "rank_recorder_plugin",
           "RECORDER_DIR": str(tmp_path / "records"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)])}
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path),
                             "--nproc-per-node", "2"], env=env, capture_output=True, text=True,
                            timeout=420)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["rank0.jsonl"]
    records = [json.loads(line) for line in
               (tmp_path / "records" / "rank0.jsonl").read_text().splitlines()]
    assert records[0] == {"start": str(tmp_path / "run")} and records[-1] == {"close": "finished"}
    logged: dict = {}
    for record in records[1:-1]:
        step = record.pop("step")
        for name, value in record.items():
            logged.setdefault(name, {})[step] = value
    assert logged == jsonl_series(tmp_path / "run")
