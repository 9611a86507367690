"""Prompt rows must carry every column a reward reads, or the run stops before training.

A row without its ``answer`` would otherwise be scored 0 by ``exact_match`` and look
like a wrong completion. Checked when the data is loaded (the tokenized records carry
each row's columns, cached or not); the message names the file, the line and the column:
the user's file (Parquet, a hub name, ...) and its row index, 0-based as ``datasets``
counts, for a source read through ``datasets``, not the JSONL astrai wrote from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from astrai_core.data.sources import read_rows
from astrai_core.data.tokenize import TokenizedSource
from astrai_core.errors import DataError

# reward name -> the columns it reads, e.g. {"exact_match": ("answer",)}
Required = Mapping[str, Sequence[str]]


def check_required_columns(source: TokenizedSource, required: Required | None,
                           field: str, origin: str | Path | None = None) -> None:
    """A DataError for the first prompt row lacking a column that a reward needs;
    ``origin``: the user's source that ``source`` (its checked JSONL) was written from."""
    if source.format != "prompt" or not required or not any(required.values()):
        return
    for index, record in enumerate(source.records):
        for reward, columns in required.items():
            # a null counts as absent: Arrow files give every row every column
            absent = [c for c in columns if record["columns"].get(c) is None]
            if absent:
                where = (f"data source {origin}, row {index}" if origin is not None else
                         f"data file {source.path}, line {_line_of(source, index)}")
                what = ("no column" if absent[0] not in record["columns"] else "a null in column")
                raise DataError(f"{where} ({field}): {what} {absent[0]!r}, which reward "
                                f"{reward!r} needs; add it to every row")


def _line_of(source: TokenizedSource, index: int) -> int:
    """The file line of the ``index``-th row (blank lines are not rows); read only on error."""
    for position, (line_number, _) in enumerate(read_rows(source.path, source.format)):
        if position == index:
            return line_number
    return index + 1  # pragma: no cover - the records came from this file
