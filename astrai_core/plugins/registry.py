"""The registry: every component that the loaded plugins provide, by kind and name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from astrai_core.errors import PluginConflictError, PluginError, UnknownComponentError
from astrai_core.plugins.known import SHIPPED
from astrai_core.plugins.specs import KINDS, Spec


@dataclass
class PluginInfo:
    """One plugin as `astrai list-plugins` shows it."""

    name: str
    distribution: str
    version: str | None
    status: str = "ok"
    error: str | None = None
    summary: str = ""
    builtin: bool = False
    provides: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "provides": {kind: sorted(names) for kind, names in self.provides.items() if names},
            "distribution": self.distribution,
            "builtin": self.builtin,
            "summary": self.summary,
        }


@dataclass
class _Conflict:
    kind: str
    name: str
    distributions: list[str]

    def message(self) -> str:
        first, second = self.distributions[0], self.distributions[1]
        return (
            f"{self.kind} {self.name!r} is provided by two distributions, {first!r} and "
            f"{second!r}. Uninstall one of them, or block one plugin with "
            "ASTRAI_DISABLE_PLUGINS=<plugin name>."
        )


class Registry:
    """Components by kind and name, with the plugin that provided each."""

    def __init__(self) -> None:
        self._specs: dict[str, dict[str, Spec]] = {kind: {} for kind in KINDS}
        self._providers: dict[tuple[str, str], PluginInfo] = {}
        self._conflicts: dict[tuple[str, str], _Conflict] = {}
        self.plugins: list[PluginInfo] = []

    # -- filled by astrai_core.plugins.discovery ------------------------------------
    def add(self, spec: Spec, plugin: PluginInfo) -> None:
        """Record ``spec`` from ``plugin``; a second distribution with the same name
        turns the name into a conflict that :meth:`get` reports."""
        key = (spec.kind, spec.name)
        if key in self._conflicts:
            self._conflicts[key].distributions.append(plugin.distribution)
            return
        previous = self._providers.get(key)
        if previous is not None and previous.distribution != plugin.distribution:
            conflict = _Conflict(spec.kind, spec.name, [previous.distribution, plugin.distribution])
            self._conflicts[key] = conflict
            del self._specs[spec.kind][spec.name]
            plugin.status, plugin.error = "error", conflict.message()
            return
        self._specs[spec.kind][spec.name] = spec
        self._providers[key] = plugin
        plugin.provides.setdefault(spec.kind, []).append(spec.name)

    # -- queries --------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        """Sorted names available for ``kind``."""
        self._check_kind(kind)
        return sorted(self._specs[kind])

    def specs(self, kind: str) -> list[Spec]:
        self._check_kind(kind)
        return [self._specs[kind][name] for name in sorted(self._specs[kind])]

    def get(self, kind: str, name: str) -> Spec:
        """The spec of ``kind`` called ``name``; a clear error when there is none."""
        self._check_kind(kind)
        key = (kind, name)
        if key in self._conflicts:
            raise PluginConflictError(self._conflicts[key].message())
        try:
            return self._specs[kind][name]
        except KeyError:
            raise UnknownComponentError(self.unknown_message(kind, name)) from None

    def load(self, kind: str, name: str) -> Any:
        """The target of ``kind``/``name``, loaded; a failure names the plugin that gave it."""
        spec = self.get(kind, name)
        try:
            return spec.load()
        except PluginError as exc:
            plugin = self._providers[(kind, name)]
            raise PluginError(f"plugin {plugin.name!r} ({plugin.distribution}): {exc}") from None

    def has(self, kind: str, name: str) -> bool:
        return name in self._specs.get(kind, {})

    def provider(self, kind: str, name: str) -> PluginInfo:
        """The plugin that provided ``kind``/``name``."""
        self.get(kind, name)
        return self._providers[(kind, name)]

    def plugin(self, name: str) -> PluginInfo | None:
        return next((p for p in self.plugins if p.name == name), None)

    def unknown_message(self, kind: str, name: str) -> str:
        """Why ``name`` is not available, and what to do about it."""
        available = ", ".join(self.names(kind)) or "none"
        message = f"unknown {kind.replace('_', ' ')} {name!r}; available: {available}."
        distribution = SHIPPED.get((kind, name))
        if distribution is None:
            # Plugins from outside this repository that failed: the name may be theirs.
            shipped = set(SHIPPED.values())
            broken = [p for p in self.plugins
                      if p.status == "error" and p.distribution not in shipped]
            if broken:
                message += " Plugins that failed to load: " + "; ".join(
                    f"{p.name} ({p.error})" for p in broken)
            return message
        installed = next((p for p in self.plugins if p.distribution == distribution), None)
        if installed is not None and installed.status != "ok":
            return (
                f"{message} {name!r} comes from {distribution}, which is installed but "
                f"{installed.status}: {installed.error}"
            )
        return f"{message} {name!r} is provided by {distribution}: pip install {distribution}"

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise UnknownComponentError(
                f"unknown component kind {kind!r}; kinds are: {', '.join(KINDS)}"
            )
