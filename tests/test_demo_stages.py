"""examples/stages.py, which runs `make demo`'s stages: order, cores, failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from stages import Stage, eval_stages, eval_summary, run_stages  # noqa: E402

WAIT_FOR = "import pathlib, sys, time\n" \
           "deadline = time.monotonic() + 60\n" \
           "while not pathlib.Path(sys.argv[1]).exists():\n" \
           "    if time.monotonic() > deadline: sys.exit(3)\n" \
           "    time.sleep(0.05)\n"


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_a_stage_starts_after_the_stages_it_needs(tmp_path):
    order = tmp_path / "order.txt"
    append = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
    stages = [Stage("last", python(append, str(order), "last"), tmp_path / "last.log",
                    needs=("first", "second")),
              Stage("second", python(append, str(order), "second"), tmp_path / "second.log",
                    needs=("first",)),
              Stage("first", python(append, str(order), "first"), tmp_path / "first.log")]
    seconds = run_stages(stages, jobs=2)
    assert order.read_text().split() == ["first", "second", "last"]
    assert set(seconds) == {"first", "second", "last"}
    assert (tmp_path / "last.log").read_text().startswith("$ ")  # each stage logs its command


def test_independent_stages_run_at_once(tmp_path):
    # "waiter" can only finish once "maker", started beside it, has made the file.
    flag = tmp_path / "flag"
    stages = [Stage("waiter", python(WAIT_FOR, str(flag)), tmp_path / "waiter.log"),
              Stage("maker", python("import pathlib, sys; pathlib.Path(sys.argv[1]).touch()",
                                    str(flag)), tmp_path / "maker.log")]
    assert set(run_stages(stages, jobs=2)) == {"waiter", "maker"}


def test_a_failed_stage_stops_the_demo_with_its_log(tmp_path, capsys):
    never = tmp_path / "never"
    stages = [Stage("slow", python(WAIT_FOR, str(never)), tmp_path / "slow.log"),
              Stage("broken", python("print('the reason'); raise SystemExit(5)"),
                    tmp_path / "broken.log"),
              Stage("after", python("pass"), tmp_path / "after.log", needs=("broken",))]
    with pytest.raises(SystemExit) as stopped:
        run_stages(stages, jobs=2)
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "stage broken failed (exit status 5)" in err and "the reason" in err
    assert not (tmp_path / "after.log").exists()  # what needs it never starts


def test_unknown_needs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown stages"):
        run_stages([Stage("a", python("pass"), tmp_path / "a.log", needs=("b",))], jobs=1)


def test_eval_stages_follow_their_training_and_their_numbers_are_summarised(tmp_path):
    checkpoints = {"sft": tmp_path / "sft/step_3", "grpo": tmp_path / "grpo/step_2"}
    evals = eval_stages("demo", "py", Path("evaluate.py"), checkpoints, tmp_path)
    assert [(s.name, s.needs) for s in evals] == [("demo/eval-sft", ("demo/sft",)),
                                                  ("demo/eval-grpo", ("demo/grpo",))]
    assert evals[0].command == ["py", "evaluate.py", str(checkpoints["sft"]),
                                "--json", str(tmp_path / "eval-sft.json")]
    (tmp_path / "eval-sft.json").write_text('{"greedy": 0.5}\n')
    (tmp_path / "eval-grpo.json").write_text('{"greedy": 0.75}\n')
    summary = eval_summary("demo", ["sft", "grpo"], tmp_path, {"demo/sft": 12.34, "other": 1.0})
    assert summary == {"sft": {"greedy": 0.5, "train_seconds": 12.3},
                       "grpo": {"greedy": 0.75, "train_seconds": 0.0}}
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
