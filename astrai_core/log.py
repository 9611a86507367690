"""Logging through structlog: readable on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure_logging(log_format: str = "auto", level: str = "info") -> None:
    """Set up structlog for this process; ``auto`` picks console on a TTY, else JSON."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    renderer = (structlog.processors.JSONRenderer() if use_json
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name) if name else structlog.get_logger()
