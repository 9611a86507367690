"""Data safety of `astrai train`: an earlier run's metrics are never silently replaced, a
signal checkpoints at the step boundary, a no-op resume says so, and a prompt row that
lacks a column a reward reads is an error naming file, line and column."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest

from astrai_core.config.schema import RunConfig
from astrai_core.errors import CheckpointError, DataError
from astrai_core.testing import read_metrics, run_astrai, tiny_run_config, write_arith_prompts
from astrai_core.training.run import prepare_run, train
from astrai_core.training.signals import TrainingInterrupted
from astrai_core.training.trainer import Trainer
from astrai_core.testing.faults import hung_command
from astrai_core.training.phases import DCP_WRITTEN
from tests.training.conftest import Watched, tiny_config, write_config


def _sft(tmp_path, **trainer):
    return RunConfig.model_validate(tiny_config(tmp_path, **trainer))


def test_fresh_run_refuses_an_output_dir_with_metrics_and_overwrite_allows_it(tmp_path):
    config = _sft(tmp_path, max_steps=2, save_every=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 47))
    (run_dir / "metrics.jsonl").write_text(old)
    with pytest.raises(CheckpointError, match="metrics.jsonl already holds") as raised:
        train(config)
    assert "--overwrite" in str(raised.value)
    assert (run_dir / "metrics.jsonl").read_text() == old  # untouched
    train(config, overwrite=True)
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]


def test_noop_resume_says_there_is_nothing_to_do(tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path, max_steps=2, save_every=0))
    assert run_astrai("train", str(path)).returncode == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = run_astrai("--log-format", "console", "train", str(path), "--resume")
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stderr.splitlines() if "nothing to do" in line]
    assert len(lines) == 1, again.stderr
    assert "step 2" in lines[0] and "trainer.max_steps is 2" in lines[0]
    assert "parameters=" not in again.stderr  # no model was built
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def _signal_at(trainer: Trainer, step: int, *signums: int) -> None:
    """Deliver ``signums`` to this process when optimizer step ``step`` is done."""
    original = trainer.strategy.after_optimizer_step

    def hook(done: int) -> None:
        original(done)
        if done == step:
            for signum in signums:
                # To this very thread: os.kill may hand the signal to another thread of the
                # process, and two signals still pending together reach Python as one.
                signal.pthread_kill(threading.get_ident(), signum)

    trainer.strategy.after_optimizer_step = hook


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_checkpoints_at_the_step_boundary_then_resume_finishes(tmp_path, signum, code):
    config = _sft(tmp_path, max_steps=4, save_every=0)
    trainer = Trainer(*prepare_run(config))
    _signal_at(trainer, 2, signum)
    with pytest.raises(TrainingInterrupted) as raised:
        trainer.fit()
    assert raised.value.exit_code == code
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"
    assert str(raised.value) == (f"stopped by {signal.Signals(signum).name} after step 2: "
                                 f"saved {checkpoint}; continue with --resume")
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step_2"]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    assert signal.getsignal(signum) is not None  # handlers restored
    train(config, resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3, 4]


def test_signal_without_checkpoint_on_signal(tmp_path):
    config = _sft(tmp_path, max_steps=4, save_every=0, checkpoint_on_signal=False)
    trainer = Trainer(*prepare_run(config))
    _signal_at(trainer, 1, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted, match="no checkpoint written"):
        trainer.fit()
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_ends_the_process_at_once(signum):
    # The default action of the second signal, in the thread that handles it: nothing
    # after it runs (os.kill could deliver it to another thread, too late), and it is no
    # exception that the code it interrupts could catch (DCP's writer catches
    # BaseException and re-raises it as a CheckpointException: a traceback, status 1).
    name = signal.Signals(signum).name
    code = ("import signal\nfrom astrai_core.training.signals import StopOnSignal\n"
            "with StopOnSignal():\n"
            "    try:\n"
            f"        signal.raise_signal(signal.{name})\n"
            "        print('first seen', flush=True)\n"
            f"        signal.raise_signal(signal.{name})\n"
            "    except BaseException as error:\n"
            "        print('caught', type(error).__name__, flush=True)\n"
            "    print('survived', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signum, done.stderr
    assert "first seen" in done.stdout, done.stdout
    assert "caught" not in done.stdout and "survived" not in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: stopped at once by a second {name}; a checkpoint being "
                      "written is left unfinished (the next run removes it)"], done.stderr


def test_a_second_sigint_during_a_save_ends_the_run_at_once_in_one_line(tmp_path):
    # Ctrl-C twice while a checkpoint is being written (the run is held inside the save by
    # the fault driver's hook): the first is noted, the second ends the process at once,
    # by SIGINT (130 for the shell), even inside DCP's writer, which would turn a
    # KeyboardInterrupt into a CheckpointException and a traceback
    path = write_config(tmp_path, tiny_config(tmp_path, max_steps=4, save_every=1,
                                              progress=False))
    run = Watched([*hung_command(DCP_WRITTEN, 1), "--log-format", "console", "train",
                   str(path)])
    run.wait_for("fault: rank 0 hangs at dcp_written of step 1")
    run.signal_group(signal.SIGINT)
    run.wait_for("received SIGINT")
    run.signal_group(signal.SIGINT)
    assert run.finish() == -signal.SIGINT, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    errors = [line for line in run.lines if line.startswith("error:")]
    assert errors == ["error: stopped at once by a second SIGINT; a checkpoint being written "
                      "is left unfinished (the next run removes it)"], run.stderr[-3000:]
    left = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert len(left) == 1 and left[0].startswith(".step_1.tmp-"), left


def _rows_missing_answer_on_line_3(path):
    write_arith_prompts(path, count=6)
    rows = path.read_text().splitlines()
    row = json.loads(rows[2])
    del row["answer"]
    rows[2] = json.dumps(row)
    path.write_text("\n".join(rows) + "\n")
    return path


def test_prompt_row_without_the_rewards_column_names_file_line_and_column(tmp_path):
    prompts = _rows_missing_answer_on_line_3(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             rewards=[{"name": "exact_match"}])
    with pytest.raises(DataError) as raised:
        prepare_run(RunConfig.model_validate(config))
    message = str(raised.value)
    assert message.startswith(f"data file {prompts}, line 3 (data.sources[0].path): "
                              "no column 'answer', which reward 'exact_match' needs")


def test_eval_prompt_row_without_the_rewards_column(tmp_path):
    config = tiny_config(tmp_path)
    evaluation = _rows_missing_answer_on_line_3(tmp_path / "eval.jsonl")
    config["data"]["eval"] = {"path": str(evaluation), "format": "prompt"}
    config["rewards"] = [{"name": "exact_match"}]
    with pytest.raises(DataError, match=r"eval.jsonl, line 3 \(data.eval.path\): no column "
                                        r"'answer'"):
        prepare_run(RunConfig.model_validate(config))
