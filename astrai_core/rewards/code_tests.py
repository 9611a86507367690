"""``code_tests``: run a row's tests against the code a completion wrote, in the sandbox.

``rewards: [{name: code_tests, mode: fraction, timeout: 2}]``. The ``tests`` column holds
either

- **assert-style tests**: Python code (a string, or a list of strings) run after the
  solution in the same program. Each top-level ``assert`` of a string is one case, run
  with the string's other top-level statements (imports, helpers) before it; each string
  of a list is one case; or
- **stdin/stdout cases**: a list of ``{"input": ..., "output": ...}`` (also as JSON text,
  or as ``{"inputs": [...], "outputs": [...]}``): the solution reads ``input`` on stdin
  and passes when its stdout equals ``output`` up to trailing whitespace on each line.

The code is the last fenced ```` ```python ```` block of the completion (an unclosed
fence counts from its start), else the whole text. ``mode: fraction`` rewards the share
of cases passed, ``mode: all`` 1.0 only when every case passes (its assert cases then run
as one program, one process per completion). All cases of a batch run at once on at most
``max_workers`` sandboxes (:func:`run_many`).

An assert case passes only if the program exits with status 0 after printing a random
token that the program prints after its tests, so a solution that exits early with
status 0 (``os._exit(0)``) fails instead of skipping the asserts. (A solution written to
read its own program file could still find the token: the sandbox contains code, it
does not make a reward unhackable.)
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astrai_core.environments.sandbox import Sandbox, SandboxConfig, run_many

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last fenced code block (a ```python one preferred), else the whole completion."""
    blocks = _FENCE.findall(completion)
    python = [body for language, body in blocks if language]
    chosen = python or [body for _, body in blocks]
    return chosen[-1] if chosen else completion


@dataclass(frozen=True)
class Case:
    """One test case: assert code run after the solution, or a stdin/stdout pair."""

    test: str | None = None
    stdin: str = ""
    expected: str | None = None


def parse_tests(tests: Any) -> list[Case]:
    """A ``tests`` cell as cases (see the module docstring)."""
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped.startswith(("[", "{")):
            try:
                return parse_tests(json.loads(stripped))
            except json.JSONDecodeError:
                pass
        return [Case(test=code) for code in _assert_cases(tests)]
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        return [Case(stdin=str(i), expected=str(o))
                for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if isinstance(tests, (list, tuple)):
        cases = []
        for item in tests:
            if isinstance(item, str):
                cases.append(Case(test=item))
            elif isinstance(item, dict) and "output" in item:
                cases.append(Case(stdin=str(item.get("input", "")), expected=str(item["output"])))
            else:
                raise ValueError(f"a test case must be assert code or {{input, output}}, got {item!r:.80}")
        return cases
    raise ValueError(f"the `tests` column must be code or a list of cases, got {type(tests).__name__}")


def _assert_cases(code: str) -> list[str]:
    """Each top-level assert with the code's other top-level statements before it."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return [code]
    setup = [node for node in body if not isinstance(node, ast.Assert)]
    asserts = [node for node in body if isinstance(node, ast.Assert)]
    if not asserts:
        return [code]
    lines = code.splitlines()
    segment = (lambda node: "\n".join(lines[node.lineno - 1:node.end_lineno]))
    prefix = "\n".join(segment(node) for node in setup)
    return [f"{prefix}\n{segment(node)}" if prefix else segment(node) for node in asserts]


def output_matches(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and blank lines at the end."""
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]
    return norm(got) == norm(expected)


class CodeTests:
    """The ``code_tests`` reward; see the module docstring."""

    required_columns = ("tests",)

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        mode: Literal["fraction", "all"] = Field(
            "fraction", description="fraction: share of cases passed; all: 1 only if all pass")
        max_workers: int = Field(4, ge=1, description="sandboxes running at once")
        timeout: float = Field(2.0, gt=0, description="wall-clock seconds per case")
        cpu_seconds: int = Field(2, ge=1, description="CPU seconds per case")
        memory_mb: int = Field(512, ge=0, description="address space per case, MiB")
        max_output_bytes: int = Field(65_536, ge=1, description="output per case")

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)
        options = self.config.model_dump(exclude={"mode", "max_workers"})
        self.sandbox = Sandbox(SandboxConfig(**options))

    def __call__(self, prompts: list[str], completions: list[str], tests: Sequence[Any] | None = None,
                 **columns: Any) -> list[float]:
        if tests is None:
            raise ValueError("needs a `tests` column in the prompt data")
        jobs = [(index, extract_code(completion), case)
                for index, (completion, cell) in enumerate(zip(completions, tests, strict=True))
                for case in self._cases(cell)]
        passed = run_many(lambda job: self._passes(job[1], job[2]), jobs, self.config.max_workers)
        totals = [0] * len(completions)
        counts = [0] * len(completions)
        for (index, _, _), ok in zip(jobs, passed, strict=True):
            totals[index] += ok
            counts[index] += 1
        if self.config.mode == "all":
            return [1.0 if counts[i] and totals[i] == counts[i] else 0.0 for i in range(len(completions))]
        return [totals[i] / counts[i] if counts[i] else 0.0 for i in range(len(completions))]

    def _cases(self, cell: Any) -> list[Case]:
        """The row's cases; for ``mode: all``, its assert cases as one program (one process)."""
        cases = parse_tests(cell)
        if self.config.mode == "all" and len(cases) > 1 and all(c.test is not None for c in cases):
            return [Case(test="\n\n".join(c.test for c in cases if c.test is not None))]
        return cases

    def _passes(self, code: str, case: Case) -> bool:
        if case.test is None:
            result = self.sandbox.run_python(code, stdin=case.stdin)
            return result.ok and output_matches(result.stdout, case.expected or "")
        token = secrets.token_hex(8)
        program = f"{code}\n\n{case.test}\nprint({token!r})\n"
        result = self.sandbox.run_python(program)
        return result.ok and result.stdout.rstrip().endswith(token)
