"""Where CLI tables print: rich on a terminal, wide unwrapped lines into a pipe or file."""

from __future__ import annotations

import os
import sys

# Off a terminal rich would assume 80 columns and wrap every table cell; a pipe into
# grep or a file reads better with one row per line.
PIPE_WIDTH = 200


def console():
    """A rich Console for stdout: the terminal's width, or PIPE_WIDTH off a terminal."""
    from rich.console import Console

    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=PIPE_WIDTH)
