"""Every built-in tracker, offline, read back with the backend's own reader: the scalars
equal metrics.jsonl's, eval metrics included; a resume continues the same backend run."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astrai_core.testing import tiny_run_config, write_arith_prompts

from .readers import jsonl_series, mlflow_series, tensorboard_series, wandb_series

pytestmark = pytest.mark.slow
# Each backend is a package of its name. A test skips only when its own backend is not
# installed; the runs report to the backends that are.
BACKENDS = ("mlflow", "tensorboard", "trackio", "wandb")
INSTALLED = [name for name in BACKENDS if importlib.util.find_spec(name)]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
            "MLFLOW_ALLOW_FILE_STORE": "true", "TRACKIO_DIR": str(tmp_path / "trackio"),
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _report_to(tmp_path: Path, backend: str) -> str | dict:
    return {"tensorboard": "tensorboard",
            "wandb": {"name": "wandb", "project": "astrai-test", "tags": ["t"]},
            "mlflow": {"name": "mlflow", "project": "astrai-test",
                       "tracking_uri": (tmp_path / "mlruns").as_uri()},
            "trackio": {"name": "trackio", "project": "astrai-test"}}[backend]


def _config(tmp_path: Path, **trainer: object) -> Path:
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(
        tmp_path, prompts, {"name": "grpo", "group_size": 4}, eval_every=2,
        rewards=[{"name": "exact_match"}, {"name": "format_regex", "pattern": "[0-9]"}],
        report_to=[_report_to(tmp_path, name) for name in INSTALLED], **trainer)
    config["data"]["eval"] = {"path": str(prompts), "format": "prompt"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _train(tmp_path: Path, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", *args],
                            cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _trackio_series(tmp_path: Path, run: str) -> dict:
    """Trackio reads TRACKIO_DIR when imported: its reader runs in a process of its own."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from readers import "
            "trackio_series; print(json.dumps(trackio_series('astrai-test', sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), run],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {name: {int(step): value for step, value in steps.items()}
            for name, steps in json.loads(out.stdout.splitlines()[-1]).items()}


def _check(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """``backend``'s scalars equal metrics.jsonl's; returns the MLflow run id (mlflow)."""
    run_dir = tmp_path / "run"
    expected = jsonl_series(run_dir)
    assert {"loss", "eval/accuracy", "eval/reward", "eval/reward/exact_match"} <= set(expected)
    if backend == "tensorboard":
        assert tensorboard_series(run_dir / "tensorboard") == expected
    elif backend == "wandb":
        history, config = wandb_series(run_dir)
        assert history == expected
        assert config["trainer"]["max_steps"] == yaml.safe_load(
            (tmp_path / "run.yaml").read_text())["trainer"]["max_steps"]
    elif backend == "mlflow":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        run_id = json.loads((run_dir / "trackers" / "mlflow.json").read_text())["run_id"]
        metrics, params, status = mlflow_series((tmp_path / "mlruns").as_uri(), run_id)
        # a file store cannot hold eval/reward beside eval/reward/exact_match: "/" became "."
        assert metrics == {name.replace("/", "."): steps for name, steps in expected.items()}
        assert params["strategy.name"] == "grpo" and status == "FINISHED"
        return run_id
    else:
        assert _trackio_series(tmp_path, "run") == expected
    return None


def _tracker_ids(run_dir: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in (run_dir / "trackers").glob("*.json")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 3-step run reporting to every installed backend."""
    if not INSTALLED:
        pytest.skip("no tracker backend installed")
    tmp_path = tmp_path_factory.mktemp("trained")
    _train(tmp_path, str(_config(tmp_path, max_steps=3)))
    return tmp_path


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The run logs steps 1-4, loses its step-4 checkpoint (as if killed before it was
    saved) and resumes from step 2; (its directory, the tracker ids of the first run)."""
    if not INSTALLED:
        pytest.skip("no tracker backend installed")
    tmp_path = tmp_path_factory.mktemp("resumed")
    config = _config(tmp_path, max_steps=4, save_every=2)
    _train(tmp_path, str(config))
    first_ids = _tracker_ids(tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_4")
    _train(tmp_path, str(config), "--resume")
    return tmp_path, first_ids


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_holds_the_metrics_of_metrics_jsonl(backend, trained, monkeypatch):
    pytest.importorskip(backend)
    _check(backend, trained, monkeypatch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resume_continues_the_same_backend_runs(backend, resumed, monkeypatch):
    """Every backend holds steps 1-4 once, in the same run."""
    pytest.importorskip(backend)
    tmp_path, first_ids = resumed
    run_dir = tmp_path / "run"
    assert _tracker_ids(run_dir).get(backend) == first_ids.get(backend)
    if backend == "wandb":
        assert len(list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))) == 2
        wandb_id = json.loads(first_ids["wandb"])["run_id"]
        assert all(p.name == f"run-{wandb_id}.wandb"
                   for p in run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    run_id = _check(backend, tmp_path, monkeypatch)
    if backend == "mlflow":
        assert run_id == json.loads(first_ids["mlflow"])["run_id"]
