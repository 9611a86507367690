"""verifiers environments built for the tests from local data: a single-turn taskset whose
rubric scores the reply, and a tool taskset whose task offers a tool. Importable by name
(the tests put this directory on sys.path), as verifiers loads tasksets by module."""

from __future__ import annotations

import json
from pathlib import Path

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


def has_digit(text: str) -> float:
    """The rubric's first criterion, also called by the tests on the same completions."""
    return float(any(c.isdigit() for c in text or ""))


def exact(text: str, answer: str) -> float:
    return float((text or "").strip() == answer)


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=0.5)
    async def digit(self, trace: vf.Trace) -> float:
        return has_digit(trace.last_reply)

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return exact(trace.last_reply, self.data.answer)


class ArithConfig(vf.TasksetConfig):
    path: str = ""


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        rows = [json.loads(line) for line in Path(self.config.path).read_text().splitlines()]
        return [ArithTask(ArithData(idx=i, prompt=row["question"], answer=row["answer"]),
                          self.config.task) for i, row in enumerate(rows)]


def write_tasks(path: Path) -> Path:
    """The local dataset: four sums as question/answer rows."""
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def arith(path: str) -> ArithTaskset:
    """``module:function`` loading: the taskset over the JSONL file at ``path``."""
    return ArithTaskset(ArithConfig(id=__name__, path=path))


__all__ = ["ArithTaskset"]
