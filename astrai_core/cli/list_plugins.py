"""`astrai list-plugins`: what is installed, its status and what it provides.

The table has one row per plugin; ``-v/--verbose`` adds one row per component with its
summary. ``--json`` is a list of plugin objects (name, version, status, error, provides,
distribution, builtin, summary), each also carrying
``components``: ``{kind: [{"name", "summary"}]}``. A plugin that is not ``ok`` says why
in the table; it was skipped and breaks nothing else.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from astrai_core.plugins.hookspecs import HOOK_FOR_KIND

STYLES = {"ok": "green", "error": "red", "incompatible": "yellow", "disabled": "dim"}
NOT_OK_NOTE = ("A plugin that is not ok was skipped and breaks nothing else; its message "
               "says what it needs.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--all", action="store_true", help="include astrai-core's built-ins")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="one row per component, with its summary")


def run(args: argparse.Namespace) -> int:
    from astrai_core.plugins import process_registry

    registry = process_registry()
    plugins = [p for p in registry.plugins if args.all or not p.builtin]
    components = plugin_components(registry)
    if args.json:
        entries = [{**p.to_json(), "components": components.get(p.distribution, {})}
                   for p in plugins]
        print(json.dumps(entries, indent=2))
        return 0
    if args.verbose:
        _print_verbose(plugins, components)
    else:
        _print_table(plugins)
    return 0


def plugin_components(registry: Any) -> dict[str, dict[str, list[dict[str, str]]]]:
    """``{distribution: {kind: [{"name", "summary"}]}}`` for every registered component."""
    found: dict[str, dict[str, list[dict[str, str]]]] = {}
    for kind in HOOK_FOR_KIND:
        for spec in registry.specs(kind):
            distribution = registry.provider(kind, spec.name).distribution
            found.setdefault(distribution, {}).setdefault(kind, []).append(
                {"name": spec.name, "summary": spec.summary})
    return found


def _problem(plugin: Any) -> str:
    """Why a plugin is not ok, in words (the exception's class name is for the JSON)."""
    error = plugin.error or plugin.status
    kind, sep, message = error.partition(": ")
    if sep and kind.isidentifier() and kind[:1].isupper():
        error = message
    return f"not loaded: {error}"


def _print_table(plugins: list[Any]) -> None:
    table = _table("name", "version", "status", "provides")
    for plugin in plugins:
        provides = "; ".join(
            f"{kind}: {', '.join(sorted(plugin.provides[kind]))}"
            for kind in HOOK_FOR_KIND if plugin.provides.get(kind)
        )
        if plugin.status != "ok":
            provides = _problem(plugin)
        elif not provides:
            provides = f"(nothing) {plugin.summary}".strip()
        table.add_row(plugin.name, plugin.version or "-", _status(plugin), provides)
    _show(table, plugins)


def _print_verbose(plugins: list[Any], components: dict[str, Any]) -> None:
    table = _table("plugin", "version", "status", "kind", "name", "summary")
    for plugin in plugins:
        head = [plugin.name, plugin.version or "-", _status(plugin)]
        if plugin.status != "ok":
            table.add_row(*head, "", "", _problem(plugin))
            continue
        rows = [(kind, item) for kind, items in components.get(plugin.distribution, {}).items()
                for item in items]
        if not rows:
            table.add_row(*head, "", "", f"(nothing) {plugin.summary}".strip())
        for index, (kind, item) in enumerate(rows):
            table.add_row(*(head if index == 0 else ["", "", ""]), kind, item["name"],
                          item["summary"])
    _show(table, plugins)


def _status(plugin: Any) -> str:
    return f"[{STYLES.get(plugin.status, '')}]{plugin.status}[/]"


def _table(*columns: str):
    from rich.table import Table

    table = Table(title="astrai plugins")
    for column in columns[:-1]:
        table.add_column(column, no_wrap=True)
    table.add_column(columns[-1], overflow="fold")
    return table


def _show(table: Any, plugins: list[Any]) -> None:
    from astrai_core.cli.output import console

    out = console()
    out.print(table)
    if any(p.status != "ok" for p in plugins):
        out.print(NOT_OK_NOTE, highlight=False)
