"""Logging through structlog: readable on a terminal, JSON lines otherwise.

On a terminal, log lines go through one shared rich console (:func:`console`), the one
the training progress bar draws on, so rich prints each line above the live bar instead
of gluing it onto the bar's line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}
_console: Any = None


def console() -> Any:
    """The process's rich console on stderr, shared by the log and the progress display."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True)  # resolves sys.stderr at each write
    return _console


def set_console(replacement: Any) -> None:
    """Use ``replacement`` (a rich Console) from now on; tests record output with it."""
    global _console
    _console = replacement


class ConsoleLogger:
    """A structlog logger that prints rendered lines through the shared rich console."""

    def msg(self, message: str) -> None:
        from rich.text import Text

        console().print(Text.from_ansi(message), soft_wrap=True, highlight=False)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


class LineLogger:
    """A structlog logger that writes each rendered line to stderr in one write.

    ``print`` writes the text and its newline separately, so the ranks of a distributed
    run sharing one stderr pipe could splice two JSON lines into one; a single write of
    a line shorter than the pipe's buffer is atomic.
    """

    def msg(self, message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def configure_logging(log_format: str = "auto", level: str = "info") -> None:
    """Set up structlog for this process; ``auto`` picks console on a TTY, else JSON."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    if use_json:
        renderer: Any = structlog.processors.JSONRenderer()
        factory: Any = lambda *args: LineLogger()  # noqa: E731
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        factory = lambda *args: ConsoleLogger()  # noqa: E731
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name) if name else structlog.get_logger()
