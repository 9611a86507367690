"""Plugin discovery: built-ins, then the ``astrai`` entry points, then ``ASTRAI_PLUGINS``.

Each plugin is loaded in isolation: one that fails to import, needs another
astrai-core version, or returns a bad spec is recorded with its status and
message, and every other plugin keeps working.
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata
from typing import Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from astrai_core.plugins import hookspecs
from astrai_core.plugins.registry import PluginInfo, Registry
from astrai_core.plugins.specs import SPEC_CLASSES, Spec

ENTRY_POINT_GROUP = "astrai"
CORE_DISTRIBUTION = "astrai-core"
BUILTIN_MODULE = "astrai_core.plugins.core_plugins"

_in_process: list[Any] = []
_cached: tuple[tuple, Registry] | None = None


def register(obj: Any) -> Any:
    """Register an object or module holding hookimpls in this process (notebooks, tests).

    Every later :func:`load_plugins` includes it. Returns ``obj`` so it can decorate.
    """
    if not any(existing is obj for existing in _in_process):
        _in_process.append(obj)
    return obj


def unregister(obj: Any) -> None:
    """Undo :func:`register`."""
    _in_process[:] = [existing for existing in _in_process if existing is not obj]


def process_registry() -> Registry:
    """The registry this process shares: discovered once, again only when what decides
    discovery changes (``ASTRAI_PLUGINS``, ``ASTRAI_DISABLE_PLUGINS``, :func:`register`).

    Commands and the run wiring use it and pass it down; components never rediscover.
    """
    global _cached
    key = (os.environ.get("ASTRAI_PLUGINS", ""), os.environ.get("ASTRAI_DISABLE_PLUGINS", ""),
           tuple(id(obj) for obj in _in_process))
    if _cached is None or _cached[0] != key:
        _cached = (key, load_plugins())
    return _cached[1]


def core_version() -> str:
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from astrai_core.version import __version__

        return __version__


def load_plugins() -> Registry:
    """Discover every plugin and return a fresh registry of their components."""
    disabled = _env_list("ASTRAI_DISABLE_PLUGINS")
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry()
    version = core_version()

    builtin = PluginInfo(name="builtin", distribution=CORE_DISTRIBUTION, version=version,
                         summary="astrai-core's own components", builtin=True)
    _load_module(manager, registry, builtin, lambda: importlib.import_module(BUILTIN_MODULE))

    for entry_point in _entry_points():
        info = _entry_point_info(entry_point)
        if info.name in disabled:
            info.status, info.error = "disabled", "listed in ASTRAI_DISABLE_PLUGINS"
            registry.plugins.append(info)
            continue
        problem = _version_problem(entry_point, version)
        if problem is not None:
            info.status, info.error = "incompatible", problem
            registry.plugins.append(info)
            continue
        _load_module(manager, registry, info, entry_point.load)

    for module_name in _env_list("ASTRAI_PLUGINS"):
        info = PluginInfo(name=module_name, distribution=f"ASTRAI_PLUGINS:{module_name}",
                          version=None, summary="loaded from ASTRAI_PLUGINS")
        if module_name in disabled:
            info.status, info.error = "disabled", "listed in ASTRAI_DISABLE_PLUGINS"
            registry.plugins.append(info)
            continue
        _load_module(manager, registry, info, lambda m=module_name: importlib.import_module(m))

    for obj in list(_in_process):
        name = getattr(obj, "__name__", None) or type(obj).__name__
        info = PluginInfo(name=name, distribution=f"in-process:{name}", version=None,
                          summary="registered with astrai_core.plugins.register()")
        _load_module(manager, registry, info, lambda o=obj: o)
    return registry


def _load_module(manager: pluggy.PluginManager, registry: Registry, info: PluginInfo,
                 loader: Any) -> None:
    """Import one plugin, call its hooks, and add its specs; record failures on ``info``."""
    registry.plugins.append(info)
    try:
        plugin = loader()
        if manager.is_registered(plugin):
            raise RuntimeError(f"{_plugin_label(plugin)} is already loaded by another plugin")
        manager.register(plugin, name=info.distribution)
        _check_hook_names(manager, plugin)
        specs = list(_collect_specs(manager, plugin))
    except Exception as exc:  # isolation: one broken plugin never breaks the others
        info.status, info.error = "error", f"{type(exc).__name__}: {exc}"
        return
    for spec in specs:
        registry.add(spec, info)
        if info.status != "ok":
            return


def _check_hook_names(manager: pluggy.PluginManager, plugin: Any) -> None:
    """A hookimpl whose name matches no astrai hook (``astrai_strategys``) is an error
    naming the hook, not a plugin that silently provides nothing."""
    try:
        manager.check_pending()
    except pluggy.PluginValidationError:
        unknown = sorted(name for name, caller in vars(manager.hook).items()
                         if getattr(caller, "spec", True) is None
                         and any(impl.plugin is plugin for impl in caller.get_hookimpls()))
        manager.unregister(plugin)
        known = ", ".join(hookspecs.HOOK_FOR_KIND.values())
        raise RuntimeError(f"unknown hook {', '.join(unknown)}; astrai's hooks are: "
                           f"{known}") from None


def _collect_specs(manager: pluggy.PluginManager, plugin: Any) -> list[Spec]:
    specs: list[Spec] = []
    for kind, hook_name in hookspecs.HOOK_FOR_KIND.items():
        hook = getattr(manager.hook, hook_name)
        for impl in hook.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            for spec in impl.function() or ():
                expected = SPEC_CLASSES[kind]
                if not isinstance(spec, expected):
                    raise TypeError(
                        f"{hook_name}() returned {type(spec).__name__}; expected {expected.__name__}"
                    )
                specs.append(spec)
    return specs


def _entry_points() -> list[metadata.EntryPoint]:
    seen: set[tuple[str, str]] = set()
    found = []
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = (entry_point.name, entry_point.value)
        if key not in seen:  # the same dist on sys.path twice shows up twice
            seen.add(key)
            found.append(entry_point)
    return sorted(found, key=lambda ep: ep.name)


def _entry_point_info(entry_point: metadata.EntryPoint) -> PluginInfo:
    dist = entry_point.dist
    name = dist.metadata["Name"] if dist is not None else entry_point.value
    return PluginInfo(
        name=entry_point.name,
        distribution=name,
        version=dist.version if dist is not None else None,
        summary=(dist.metadata.get("Summary") or "") if dist is not None else "",
    )


def _version_problem(entry_point: metadata.EntryPoint, version: str) -> str | None:
    """Why the plugin's astrai-core requirement excludes this core, or None."""
    dist = entry_point.dist
    if dist is None:
        return None
    for line in dist.requires or ():
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != CORE_DISTRIBUTION:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            if requirement.specifier.contains(Version(version), prereleases=True):
                return None
        except InvalidVersion:
            return None
        return (
            f"requires astrai-core{requirement.specifier} but astrai-core {version} is "
            f"installed; install a {dist.metadata['Name']} release built for astrai-core {version}"
        )
    return None


def _env_list(variable: str) -> list[str]:
    return [item.strip() for item in os.environ.get(variable, "").split(",") if item.strip()]


def _plugin_label(plugin: Any) -> str:
    return getattr(plugin, "__name__", None) or repr(plugin)


__all__ = ["core_version", "load_plugins", "process_registry", "register", "unregister"]
