"""astrai's plugin system: the hooks, the records plugins return, discovery and the registry.

- :mod:`~astrai_core.plugins.hookspecs`: the hook specifications, one per component kind,
  and the ``hookimpl`` marker.
- :mod:`~astrai_core.plugins.specs`: the spec records (``StrategySpec``, ...) a hook returns.
- :mod:`~astrai_core.plugins.protocols`: what the core calls on each kind's target, checked
  when a spec is loaded.
- :mod:`~astrai_core.plugins.discovery`: finds plugins (the core's own, the ``astrai`` entry
  points, ``ASTRAI_PLUGINS``, :func:`register`) and builds a registry.
- :mod:`~astrai_core.plugins.registry`: components by kind and name, with their provider.
- :mod:`~astrai_core.plugins.core_plugins`: astrai-core's own components, registered
  through the same hooks as any plugin.
- :mod:`~astrai_core.plugins.known`: which distribution of this repository provides which
  name, for the "pip install ..." hint of an unknown name.

Nothing here imports torch.
"""

from astrai_core.plugins.discovery import (
    core_version,
    load_plugins,
    process_registry,
    register,
    unregister,
)

__all__ = ["core_version", "load_plugins", "process_registry", "register", "unregister"]
