"""Run configuration: YAML → pydantic, `--set` overrides, errors that name the field."""

from astrai_core.config.loader import load_config, parse_overrides
from astrai_core.config.schema import ComponentSection, RunConfig

__all__ = ["ComponentSection", "RunConfig", "load_config", "parse_overrides"]
