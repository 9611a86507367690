"""What a run shows: heartbeat lines off a terminal, log lines above the live bar on one,
evaluation results when it finishes, and the end-of-run summary. The clock is a fake
one that advances by a fixed amount per reading, so nothing here depends on timing."""

from __future__ import annotations

import io
import re

import pytest
import structlog
from rich.console import Console
from structlog.testing import capture_logs

from astrai_core import log as astrai_log
from astrai_core.config.schema import RunConfig
from astrai_core.testing import ARITH_TOKENIZER  # noqa: F401  (the kit's data is present)
from astrai_core.training.progress import Heartbeat, RunReporter
from astrai_core.training.run import prepare_run
from astrai_core.training.trainer import Trainer
from tests.training.conftest import tiny_config


class FakeClock:
    """Each reading is ``tick`` seconds after the previous one."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = -tick, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def terminal():
    """The shared console as a 100-column terminal writing into a buffer, logs on it."""
    buffer = io.StringIO()
    astrai_log.set_console(Console(file=buffer, force_terminal=True, width=100,
                                   color_system=None))
    astrai_log.configure_logging("console")
    yield buffer
    astrai_log.set_console(None)
    structlog.reset_defaults()


@pytest.fixture
def off_terminal():
    astrai_log.set_console(Console(file=io.StringIO(), force_terminal=False))
    yield
    astrai_log.set_console(None)


def test_heartbeat_logs_step_loss_tokens_per_second_and_eta():
    clock = FakeClock(4.0)  # start 0; steps read 4, 8, 12, ...
    beat = Heartbeat(every=10.0, total=10, start=0, clock=clock)
    with capture_logs() as logs:
        logged = [beat.step(step, loss=1.0 / step, tokens=100.0) for step in range(1, 7)]
    assert logged == [False, False, True, False, False, True]
    first, second = logs
    # step 3 at t=12: 300 tokens in 12 s; 4 s per step, 7 steps left
    assert first == {"event": "progress", "log_level": "info", "step": 3, "max_steps": 10,
                     "loss": 0.3333, "tokens_per_s": 25.0, "eta": "0:00:28"}
    # step 6 at t=24: 300 tokens since t=12; 4 steps left
    assert (second["step"], second["tokens_per_s"], second["eta"]) == (6, 25.0, "0:00:16")


def test_log_lines_print_above_the_live_bar(terminal):
    reporter = RunReporter(total=4, start=0, bar=True, heartbeat_seconds=10, clock=FakeClock(1))
    reporter.step(1, loss=2.5, tokens=10, tokens_per_s=123.0)
    structlog.get_logger("t").info("data cache hit", entry="x")
    reporter.eval_progress(3, 6)
    output_during_eval = terminal.getvalue()
    reporter.eval_finished(1, {"eval/accuracy": 0.25})
    reporter.step(2, loss=2.0, tokens=10, tokens_per_s=100.0)
    reporter.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())
    lines = [part for line in text.splitlines() for part in line.split("\r")]
    cache = [line for line in lines if "data cache hit" in line]
    assert cache and all(re.match(r"\d{4}-\d\d-\d\dT", line) for line in cache), cache
    assert any(line.startswith("eval") and "3/6" in line
               for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output_during_eval)
               .replace("\r", "\n").splitlines())
    assert any("evaluation" in line and "eval/accuracy=0.25" in line for line in lines)
    assert any(line.startswith("train") and "2/4" in line and "loss 2.0000" in line
               for line in lines)


def test_a_run_off_a_terminal_beats_evaluates_and_summarizes(tmp_path, off_terminal):
    config = tiny_config(tmp_path, max_steps=4, save_every=2, heartbeat_seconds=10)
    prompts = tmp_path / "eval.jsonl"
    from astrai_core.testing import write_arith_prompts
    write_arith_prompts(prompts, count=4)
    config["data"]["eval"] = {"path": str(prompts), "format": "prompt"}
    config["rewards"] = [{"name": "exact_match"}]
    config["sampler"] = {"name": "torch", "max_new_tokens": 2}
    config["trainer"].update(eval_max_new_tokens=2, eval_every=2)
    trainer = Trainer(*prepare_run(RunConfig.model_validate(config)), clock=FakeClock(6.0))
    with capture_logs() as logs:
        last = trainer.fit()
    events = [entry["event"] for entry in logs]
    # clock: reporter 0, heartbeat 6, steps 12, 18, 24, 30 -> beats at steps 2 and 4
    beats = [entry for entry in logs if entry["event"] == "progress"]
    assert [(b["step"], b["eta"]) for b in beats] == [(2, "0:00:12"), (4, "0:00:00")]
    evaluations = [entry for entry in logs if entry["event"] == "evaluation"]
    assert [e["step"] for e in evaluations] == [2, 4]
    assert evaluations[-1]["eval/accuracy"] == round(last["eval/accuracy"], 4)
    summary = logs[-1]
    assert events[-1] == "run finished"
    assert summary["steps"] == 4 and summary["wall_time"] == "0:00:36"
    assert summary["last_loss"] == round(last["loss"], 4)
    assert summary["eval/accuracy"] == round(last["eval/accuracy"], 4)
    assert summary["checkpoint"] == str(tmp_path / "run" / "checkpoints" / "step_4")


def test_summary_on_a_terminal_is_a_table(terminal):
    reporter = RunReporter(total=2, start=0, bar=False, heartbeat_seconds=0, clock=FakeClock(30))
    reporter.summary(steps=2, last={"loss": 0.5}, evaluation={"eval/accuracy": 0.75},
                     checkpoint=None)
    text = terminal.getvalue()
    assert "run finished" in text
    for row in (r"steps\s+.\s*2", r"wall_time\s+.\s*0:00:30", r"last_loss\s+.\s*0\.5",
                r"eval/accuracy\s+.\s*0\.75", r"checkpoint\s+.\s*-"):
        assert re.search(row, text), (row, text)


def test_without_the_bar_a_terminal_gets_the_heartbeat(terminal):
    reporter = RunReporter(total=3, start=0, bar=False, heartbeat_seconds=5, clock=FakeClock(5))
    with capture_logs() as logs:
        for step in (1, 2, 3):
            reporter.step(step, loss=1.0, tokens=10, tokens_per_s=0.0)
    assert [entry["step"] for entry in logs if entry["event"] == "progress"] == [1, 2, 3]
    quiet = RunReporter(total=3, start=0, bar=True, heartbeat_seconds=5, clock=FakeClock(5))
    with capture_logs() as logs:
        quiet.step(1, loss=1.0, tokens=10, tokens_per_s=0.0)
    quiet.close()
    assert logs == []  # the bar shows it
