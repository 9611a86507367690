"""A tiny arithmetic SFT run (data + config) in a temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from astrai_core.testing import ARITH_TOKENIZER, REPO_ROOT, TINY_MODEL

GENERATE = REPO_ROOT / "examples" / "arith" / "generate.py"


def tiny_config(tmp_path: Path, **trainer: object) -> dict:
    data_dir = tmp_path / "data"
    if not data_dir.exists():
        subprocess.run([sys.executable, str(GENERATE), "--out",
                        str(data_dir), "--seed", "0", "--n-train", "400", "--n-eval", "16",
                        "--n-rl", "16"], check=True, capture_output=True)
    return {
        "output_dir": str(tmp_path / "run"),
        "model": {"tokenizer": str(ARITH_TOKENIZER), "config": dict(TINY_MODEL)},
        "data": {"sources": [{"path": str(data_dir / "sft_train.jsonl"), "format": "chat"}],
                 "seq_len": 64, "batch_size": 4, "cache_dir": str(tmp_path / "cache")},
        "strategy": {"name": "sft"},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 12, "lr": 3e-3, "warmup_steps": 2, "save_every": 4,
                    "eval_every": 0, "eval_at_start": False, **trainer},
    }


def write_config(tmp_path: Path, config: dict, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def assert_a_missing_image_stops_the_run(tmp_path: Path, config: dict, data: Path) -> None:
    """Line 3 of ``data`` (its first image part in OpenAI's shape) names an image that is
    not there: ``astrai train`` says so in one line naming the file, the line and the
    image, and exits with code 2, no traceback."""
    import json

    rows = data.read_text().splitlines()
    row = json.loads(rows[2])
    row["messages"][0]["content"][0]["image_url"]["url"] = "gone.png"
    rows[2] = json.dumps(row)
    data.write_text("\n".join(rows) + "\n")
    result = astrai("train", str(write_config(tmp_path, config)))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: data file {data}, line 3: image gone.png cannot be read "
                      "(no such file)"]
    assert "Traceback" not in result.stderr


def astrai(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astrai_core.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@pytest.fixture
def tiny_run(tmp_path):
    return tiny_config(tmp_path)


def install_plugin(tmp_path: Path, monkeypatch, plugin: str, modules: dict[str, str]) -> None:
    """Write ``modules`` ({name: source}) to a fresh directory on sys.path and load
    ``plugin`` (one of them) through ASTRAI_PLUGINS, as an outside plugin would be."""
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    for name, source in modules.items():
        (plugin_dir / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("ASTRAI_PLUGINS", plugin)


class Watched:
    """A command run in its own session (as a terminal's foreground job: a signal to its
    process group is what Ctrl-C sends), its stderr collected line by line as it comes."""

    def __init__(self, command: list[str], timeout: float = 420) -> None:
        import threading

        self.deadline = time.monotonic() + timeout
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def running(self) -> None:
        """Assert that the process is still going, within its time."""
        assert self.process.poll() is None, self.stderr[-4000:]
        assert time.monotonic() < self.deadline, self.stderr[-4000:]

    def wait_for(self, text: str, count: int = 1) -> None:
        """Until ``text`` was written ``count`` times (the run must still be going; the
        ranks' lines may share a line of the pipe)."""
        while sum(line.count(text) for line in self.lines) < count:
            self.running()
            time.sleep(0.2)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.process.pid, signum)

    def finish(self) -> int:
        """The exit status, once the process and its stderr are done."""
        code = self.process.wait(timeout=max(self.deadline - time.monotonic(), 1))
        self.reader.join(timeout=30)
        return code


# The sampler reports log pi + 0.4 on even positions, log pi - 0.4 on odd ones (with
# ``every_other_row``: only on the even-numbered completions of each call; with
# ``sign: -1`` the other way round).
SHIFT = 0.4
PLUGIN = f'''
from astrai_core import hookimpl, SamplerSpec

@hookimpl
def astrai_samplers():
    return [SamplerSpec(name="perturbed", target="rc_test_plugin:Perturbed",
                        summary="the torch sampler, misreporting its log-probs")]

import dataclasses

from astrai_core.sampling.torch_sampler import TorchSampler

class Perturbed(TorchSampler):
    # its generate does not take the torch sampler's interrupt
    capabilities = dataclasses.replace(TorchSampler.capabilities, interruptible=False)

    class Config(TorchSampler.Config):
        every_other_row: bool = False
        sign: int = 1

    def __init__(self, model, tokenizer=None, every_other_row=False, sign=1, **engine):
        super().__init__(model, tokenizer, **engine)  # the torch sampler's own options
        self.every_other_row, self.sign = every_other_row, sign

    def generate(self, prompts, params, on_token=None):
        completions = super().generate(prompts, params, on_token)
        for row, completion in enumerate(completions):
            if self.every_other_row and row % 2:
                continue
            completion.logprobs = [lp + self.sign * ({SHIFT} if i % 2 == 0 else -{SHIFT})
                                   for i, lp in enumerate(completion.logprobs)]
        return completions
'''


@pytest.fixture
def perturbed_sampler(tmp_path, monkeypatch):
    """The ``perturbed`` sampler: the torch sampler misreporting its log-probs by SHIFT."""
    install_plugin(tmp_path, monkeypatch, "rc_test_plugin", {"rc_test_plugin": PLUGIN})
