"""Run configuration: YAML → pydantic, `--set` overrides, errors that name the field, and
the run plan that resolves and cross-checks every section before any work starts."""

from astrai_core.config.loader import ConfigFile, load_config, parse_overrides, read_config
from astrai_core.config.schema import ComponentSection, RunConfig

__all__ = ["ComponentSection", "ConfigFile", "RunConfig", "load_config", "parse_overrides",
           "read_config"]
