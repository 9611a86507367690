"""The README and docs/ speak to users: figures name a command and a date, never how the
project was built (work sessions, issue numbers, branches, commit hashes). The history
lives in CHANGELOG.md, which is exempt. The README stays short, and every row of its
numbers tables names the command that reproduces it and the date it was measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
USER_FACING = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 210

# A number after "session" or "issue" ("session 4", "Issue #13", "issue 10's").
_WORK_ITEM = re.compile(r"\b(session|issue)s?\s*#?\s*\d+", re.IGNORECASE)
_BRANCH = re.compile(r"\bthis branch\b|\bcurrent main\b", re.IGNORECASE)
# 7-40 hex digits with at least one digit and one letter: a decimal number is not a hash.
_HEX = r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
# A hash used as a label anywhere, code included: "main at 037cca9", "commit 037cca9",
# "(037cca9)".
_HASH_LABEL = re.compile(rf"\b(?:main|master|HEAD|commit|branch)\s+(?:at\s+)?{_HEX}\b|\(\s*{_HEX}\s*\)")
# In prose (code stripped), any such word is a hash;
# hex in code (sha256 examples, node ids in error messages) is left alone.
_HEX_WORD = re.compile(rf"\b{_HEX}\b")
_CODE = re.compile(r"```.*?```|`[^`]+`", re.DOTALL)  # inline code may wrap a line
_COMMAND = re.compile(r"`[^`]*(?:python|make|astrai|torchrun)\b[^`]*`")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def build_labels(text: str) -> list[str]:
    """The places where ``text`` labels something by how the project was built."""
    prose = _CODE.sub(" ", text)
    found = [m.group(0) for m in _WORK_ITEM.finditer(text)]
    found += [m.group(0) for m in _BRANCH.finditer(text)]
    found += [m.group(0) for m in _HASH_LABEL.finditer(text)]
    found += [m.group(0) for m in _HEX_WORD.finditer(prose)]
    return found


def numbers_table_rows(text: str) -> list[str]:
    """The body rows of every table in the README's "## Numbers" section."""
    match = re.search(r"^## Numbers\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Numbers' section"
    rows: list[str] = []
    table: list[str] = []
    for line in [*match.group(1).splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            rows += table[2:]  # the header and the |---| line
            table = []
    return rows


def rows_without_command_or_date(text: str) -> list[str]:
    return [row for row in numbers_table_rows(text)
            if not (_COMMAND.search(row) and _DATE.search(row))]


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: p.name)
def test_no_figure_is_labelled_by_how_the_project_was_built(path):
    labels = build_labels(path.read_text())
    assert not labels, f"{path.name} labels figures by how they were built: {labels}"


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_every_number_in_the_readme_names_its_command_and_date():
    rows = numbers_table_rows(README.read_text())
    assert len(rows) >= 5, "the README's numbers tables lost their rows"
    assert not rows_without_command_or_date(README.read_text())


@pytest.mark.parametrize("text", [
    "| before (main at 037cca9), run 1 | 12.64 s/step |",
    "the fix (a019095) made it faster",
    "measured in session 4 on the idle machine",
    "see Issue #13's section",
    "| stage | issue 10's run-plan refactor |",
    "after (this branch), run 2",
    "as measured on current main",
    "the numbers since 2ca89e1 moved",
])
def test_build_labels_are_found(text):
    assert build_labels(text)


@pytest.mark.parametrize("text", [
    "`rollout worker 0 (pid 4242) on node 10.0.0.7 (node id 3187e154c4f1) died`",
    "```\nsha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n```",
    "the browser session keeps its state; issues no collective; 2026-12-01",
    "a deadbeef value, 1e-4 tolerance, 1234567 tokens (1234567)",
])
def test_code_and_ordinary_words_are_not_build_labels(text):
    assert not build_labels(text)


def test_a_numbers_row_without_command_or_date_is_found():
    text = ("## Numbers\n\n| benchmark | command | result | measured |\n|---|---|---|---|\n"
            "| ok | `python bench/bench_sampler.py` | 1.2× | 2026-12-01 |\n"
            "| no date | `make demo` | 0.344 | |\n"
            "| no command | bench_sampler | 1.2× | 2026-12-01 |\n\n## Next\n| x | y |\n")
    assert [row.split("|")[1].strip() for row in rows_without_command_or_date(text)] == [
        "no date", "no command"]
