"""``rollout.log_samples``: the first rollout's and every N-th rollout's samples, the
prompt exactly as the model saw it, reach the run log and the trackers that take text."""

from __future__ import annotations

import pytest
import structlog

from astrai_core.config.schema import RunConfig
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.trackers.report import RunReport
from astrai_core.training.run import train


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


class _Log:
    def write(self, step, metrics):
        pass


class _Texts:
    def __init__(self):
        self.got = []

    def log_samples(self, samples, step):
        self.got.append((step, samples))


class _Broken:
    def log_samples(self, samples, step):
        raise RuntimeError("down")


def test_report_gives_samples_to_trackers_that_take_them(capsys):
    texts = _Texts()
    report = RunReport(_Log(), [("texts", texts), ("scalars_only", object()), ("broken", _Broken())])
    sample = {"prompt": "<|user|>1+1=<|end|><|assistant|>", "completion": "2", "reward": 1.0}
    report.write_samples(3, [sample])
    assert texts.got == [(3, [sample])]
    assert [name for name, _ in report.trackers] == ["texts", "scalars_only", "broken"]
    out = capsys.readouterr().out
    assert "rollout sample (step 3, reward 1): prompt '<|user|>1+1=<|end|><|assistant|>'" in out
    assert "tracker 'broken' failed to log rollout samples at step 3" in out


def test_training_logs_rendered_samples_to_the_log_and_tensorboard(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2}, max_steps=4,
                             report_to=["tensorboard"])
    config["rollout"] = {"log_samples": 3, "log_samples_count": 2}
    train(RunConfig.model_validate(config))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "rollout sample (step" in line]
    assert [line.split("rollout sample (step ")[1].split(",")[0] for line in lines] == \
        ["1", "1", "3", "3"]
    assert all("prompt '<|user|>" in line and "<|assistant|>' completion" in line
               for line in lines)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode()
             for e in events.Tensors("rollout/samples/text_summary")}
    assert sorted(texts) == [1, 3] and "<|user|>" in texts[1] and texts[1].count("- reward") == 2


def test_mlflow_keeps_the_samples_as_a_text_artifact(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from astrai_core.trackers.base import TrackedRun
    from astrai_core.trackers.mlflow import MLflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker = MLflow(project="astrai-test", tracking_uri=(tmp_path / "mlruns").as_uri())
    tracker.start(TrackedRun(tracker="mlflow", config={}, output_dir=tmp_path, resume_step=None))
    tracker.log_samples([{"prompt": "<|user|>1+1=<|end|><|assistant|>", "completion": "2",
                          "reward": 1.0}], 7)
    tracker.close("finished")
    [artifact] = (tmp_path / "mlruns").rglob("rollout_samples/step_00000007.txt")
    assert artifact.read_text() == "- reward 1: prompt `'<|user|>1+1=<|end|><|assistant|>'` " \
                                   "completion `'2'`"
