"""The core's version, in a module of its own so that any layer may read it without
importing the package's public names (and the plugin system with them)."""

__version__ = "0.1.0"
