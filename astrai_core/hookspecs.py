"""The hook specifications, importable as ``astrai_core.hookspecs``.

They live in :mod:`astrai_core.plugins.hookspecs`; this module re-exports the same
objects (the hook functions carry their pluggy markers), so
``PluginManager.add_hookspecs(astrai_core.hookspecs)`` declares the same hooks.
"""

from astrai_core.plugins.hookspecs import *  # noqa: F403
