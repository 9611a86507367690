"""`trainer.report_to`: its config shape and plan-time errors, and what a tracker is given:
the config once, every logged step, and close() at the end, on an error and on a signal."""

from __future__ import annotations

import json
import re
import signal
import types
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from astrai_core import TrackerSpec, hookimpl
from astrai_core.cli.main import main
from astrai_core.config.schema import RunConfig
from astrai_core.errors import AstraiError
from astrai_core.plugins import load_plugins, register, unregister
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.trackers import wandb as wandb_tracker
from astrai_core.training.run import train
from astrai_core.training.signals import TrainingInterrupted

from .readers import jsonl_series

CALLS: list[tuple[str, Any]] = []


class Recorder:
    """A tracker that records its calls; ``fail_at`` raises from log() at that step,
    ``signal_at`` sends SIGTERM to this process during that step's log()."""

    requires = ()
    install = ""

    def __init__(self, fail_at: int | None = None, signal_at: int | None = None) -> None:
        self.fail_at, self.signal_at = fail_at, signal_at

    def start(self, run: Any) -> None:
        CALLS.append(("start", (run.config, run.resume_step)))

    def log(self, metrics: dict[str, float], step: int) -> None:
        CALLS.append(("log", (step, metrics)))
        if step == self.fail_at:
            raise ConnectionError("dashboard unreachable")
        if step == self.signal_at:
            signal.raise_signal(signal.SIGTERM)

    def close(self, status: str) -> None:
        CALLS.append(("close", status))


@pytest.fixture()
def recorder():
    module = types.ModuleType("recorder_tracker_plugin")

    @hookimpl
    def astrai_trackers():
        return [TrackerSpec(name="recorder", target=f"{__name__}:Recorder", summary="records")]

    module.astrai_trackers = astrai_trackers
    CALLS.clear()
    register(module)
    yield CALLS
    unregister(module)


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def _config(tmp_path: Path, report_to: list, **trainer: Any) -> dict:
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    return tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                           report_to=report_to, **trainer)


def test_tracker_is_a_registry_kind_with_the_four_built_ins():
    registry = load_plugins()
    assert registry.names("tracker") == ["mlflow", "tensorboard", "trackio", "wandb"]
    assert "tracker" in registry.plugin("builtin").provides


def test_names_and_entries_normalise_to_entries(tmp_path):
    config = RunConfig.model_validate(_config(tmp_path, ["tensorboard",
                                                         {"name": "wandb", "mode": "offline"}]))
    entries = config.trainer.report_to
    assert [(e.name, e.params) for e in entries] == [("tensorboard", {}),
                                                     ("wandb", {"mode": "offline"})]
    single = RunConfig.model_validate(_config(tmp_path, "tensorboard")).trainer.report_to
    assert [e.name for e in single] == ["tensorboard"]


def _plan_error(tmp_path: Path, config: dict, capsys) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-format", "json", "train", str(path)])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), lines
    assert not (tmp_path / "run").exists()
    return lines[0]


def test_an_unknown_tracker_lists_the_trackers(tmp_path, capsys):
    line = _plan_error(tmp_path, _config(tmp_path, ["tensorboard", "neptune"]), capsys)
    assert "trainer.report_to.1.name: unknown tracker 'neptune'" in line
    assert "mlflow, tensorboard, trackio, wandb" in line


def test_a_bad_tracker_option_names_its_field(tmp_path, capsys):
    line = _plan_error(tmp_path, _config(tmp_path, [{"name": "wandb", "mode": "offlin"}]),
                       capsys)
    assert re.search(r"trainer\.report_to\.0\.mode: Input should be 'online'", line), line
    line = _plan_error(tmp_path, _config(tmp_path, [{"name": "mlflow", "projet": "x"}]), capsys)
    assert "trainer.report_to.0.projet" in line


def test_a_tracker_listed_twice(tmp_path, capsys):
    line = _plan_error(tmp_path, _config(tmp_path, ["tensorboard", "tensorboard"]), capsys)
    assert "trainer.report_to.1.name: tracker 'tensorboard' is listed twice" in line


def test_a_missing_backend_names_the_pip_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(wandb_tracker.WandB, "requires", ("astrai_no_such_module",))
    line = _plan_error(tmp_path, _config(tmp_path, ["wandb"]), capsys)
    assert ("trainer.report_to.0.name: tracker 'wandb' needs the 'astrai_no_such_module' "
            "package, which is not installed: pip install 'astrai-core[wandb]'") in line


def _logged(calls: list) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    for kind, payload in calls:
        if kind == "log":
            step, metrics = payload
            for name, value in metrics.items():
                series.setdefault(name, {})[step] = value
    return series


def test_a_tracker_gets_the_config_every_step_and_close(tmp_path, recorder):
    config = _config(tmp_path, ["recorder"], max_steps=3, eval_at_start=True)
    config["data"]["eval"] = {"path": str(tmp_path / "prompts.jsonl"), "format": "prompt"}
    config["rewards"] = [{"name": "exact_match"}, {"name": "format_regex", "pattern": "[0-9]"}]
    train(RunConfig.model_validate(config))
    kinds = [kind for kind, _ in recorder]
    assert kinds == ["start", "log", "log", "log", "log", "close"]
    resolved, resume_step = recorder[0][1]
    assert resume_step is None and resolved["trainer"]["max_steps"] == 3
    assert resolved["trainer"]["report_to"] == [{"name": "recorder"}]
    assert _logged(recorder) == jsonl_series(tmp_path / "run")
    assert "eval/accuracy" in _logged(recorder) and recorder[-1] == ("close", "finished")


def test_a_failing_tracker_is_dropped_and_the_run_goes_on(tmp_path, recorder):
    train(RunConfig.model_validate(_config(tmp_path, [{"name": "recorder", "fail_at": 2}],
                                           max_steps=3)))
    steps = [payload[0] for kind, payload in recorder if kind == "log"]
    assert steps == [1, 2] and recorder[-1] == ("close", "failed")
    assert sorted(jsonl_series(tmp_path / "run")["loss"]) == [1, 2, 3]


def test_a_signal_closes_the_tracker_as_interrupted(tmp_path, recorder):
    config = _config(tmp_path, [{"name": "recorder", "signal_at": 2}], max_steps=4)
    with pytest.raises(TrainingInterrupted):
        train(RunConfig.model_validate(config))
    assert recorder[-1] == ("close", "interrupted")
    assert [p[0] for k, p in recorder if k == "log"] == [1, 2]


def test_an_error_closes_the_tracker_as_failed(tmp_path, recorder):
    config = _config(tmp_path, ["recorder"], max_steps=3)
    config["rewards"] = [{"name": f"{__name__}:broken_reward"}]
    with pytest.raises(AstraiError):
        train(RunConfig.model_validate(config))
    assert [k for k, _ in recorder] == ["start", "close"] and recorder[-1] == ("close", "failed")


def broken_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    raise RuntimeError("this reward always fails")


def test_resume_tells_the_tracker_its_step(tmp_path, recorder):
    config = _config(tmp_path, ["recorder"], max_steps=2)
    train(RunConfig.model_validate(config))
    config["trainer"]["max_steps"] = 3
    recorder.clear()
    train(RunConfig.model_validate(config), resume=True)
    assert recorder[0][1][1] == 2
    assert [p[0] for k, p in recorder if k == "log"] == [3]
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
