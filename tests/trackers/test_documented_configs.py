"""Every ``report_to`` example of docs/trackers.md, exactly as written there, with the
network off (W&B offline, the hub offline): each plans, and starts, logs and closes, or,
where it names a server that cannot be reached, is one plan error before the model loads.
MLflow without a tracking_uri writes to a file store under output_dir (the installed
``mlflow-skinny`` cannot open MLflow's own default, ``sqlite:///mlflow.db``)."""

from __future__ import annotations

import re

import pytest
import yaml

from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.testing import REPO_ROOT, tiny_run_config, write_arith_prompts
from astrai_core.trackers.report import open_report

DOC = REPO_ROOT / "docs" / "trackers.md"
UNREACHABLE = "http://mlflow.internal:5000"  # a server name that resolves nowhere here


def documented_examples() -> list[list]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    return [yaml.safe_load(b)["trainer"]["report_to"] for b in blocks if "report_to" in b]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    for package in ("tensorboard", "wandb", "mlflow", "trackio"):
        pytest.importorskip(package)
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
                        "TRACKIO_DIR": str(tmp_path / "trackio")}.items():
        monkeypatch.setenv(name, value)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_the_doc_has_the_examples():
    assert [len(e) for e in documented_examples()] == [2, 4]


@pytest.mark.parametrize("index", range(2))
def test_each_documented_example_plans_and_reports(tmp_path, offline, index):
    entries = documented_examples()[index]
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo"}, report_to=entries)
    if any(isinstance(e, dict) and e.get("tracking_uri") == UNREACHABLE for e in entries):
        with pytest.raises(ConfigError, match=r"^trainer\.report_to\.2: tracker 'mlflow': "
                           rf"cannot reach the MLflow server at {UNREACHABLE}: [^\n]+$"):
            plan_run(RunConfig.model_validate(config))
        # the same entries with that server left out (MLflow's default store) all report
        entries = [{k: v for k, v in e.items() if k != "tracking_uri"}
                   if isinstance(e, dict) else e for e in entries]
        config["trainer"]["report_to"] = entries
    plan = plan_run(RunConfig.model_validate(config))
    output_dir = tmp_path / "run"
    report = open_report(None, plan.trackers, config={"trainer": {"lr": 0.01}},
                         output_dir=output_dir, resume_step=None)
    for _, tracker in report.trackers:
        tracker.log({"loss": 1.5}, 1)
    report.close("finished")
    assert len(report.trackers) == len(entries)
    if any("mlflow" in (e if isinstance(e, str) else e["name"]) for e in entries):
        assert (output_dir / "mlruns").is_dir() and not (tmp_path / "mlflow.db").exists()


def test_a_database_store_the_client_cannot_open_is_a_plan_error(tmp_path, offline):
    import importlib.util

    if importlib.util.find_spec("sqlalchemy") is not None:
        pytest.skip("the full mlflow package opens database stores")
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"), {"name": "grpo"},
                             report_to=[{"name": "mlflow", "tracking_uri": "sqlite:///mlflow.db"}])
    with pytest.raises(ConfigError, match=r"trainer\.report_to\.0: tracker 'mlflow': tracking_uri "
                       r"'sqlite:///mlflow\.db' is a database store, which the installed MLflow "
                       r"client cannot open without SQLAlchemy"):
        plan_run(RunConfig.model_validate(config))
