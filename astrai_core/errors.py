"""User-facing errors: the CLI prints their message (no traceback) and exits non-zero."""

from __future__ import annotations


class AstraiError(Exception):
    """A mistake in user input (config, data, checkpoint, plugin choice)."""

    exit_code = 2


class ConfigError(AstraiError):
    """A config value is missing or invalid; the message names the field path."""


class DataError(AstraiError):
    """A data file is missing or a row is malformed; the message names file and line."""


class CheckpointError(AstraiError):
    """A checkpoint is missing, incomplete or does not match the model."""


class PluginError(AstraiError):
    """A plugin component cannot be found or used."""


class UnknownComponentError(PluginError, KeyError):
    """No component of this kind has this name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PluginConflictError(PluginError):
    """Two distributions provide the same name for the same kind."""


class FieldError(ConfigError):
    """A config mistake found after the file was read, located by its field path.

    The run plan turns it into ``file:line: dotted.path: message`` (one formatter for
    every config error), so code that finds a problem only names the field.
    """

    def __init__(self, path: tuple, message: str) -> None:
        super().__init__(f"{'.'.join(map(str, path))}: {message}")
        self.path = tuple(path)
        self.message = message
