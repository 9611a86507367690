"""`astrai list-plugins`: what is installed, its status and what it provides."""

from __future__ import annotations

import argparse
import json

from astrai_core.hookspecs import HOOK_FOR_KIND


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--all", action="store_true", help="include astrai-core's built-ins")


def run(args: argparse.Namespace) -> int:
    from astrai_core.plugins import process_registry

    registry = process_registry()
    plugins = [p for p in registry.plugins if args.all or not p.builtin]
    if args.json:
        print(json.dumps([p.to_json() for p in plugins], indent=2))
        return 0
    _print_table(plugins)
    return 0


def _print_table(plugins) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="astrai plugins")
    for column in ("name", "version", "status", "provides"):
        table.add_column(column)
    styles = {"ok": "green", "error": "red", "incompatible": "yellow", "disabled": "dim"}
    for plugin in plugins:
        provides = "; ".join(
            f"{kind}: {', '.join(sorted(plugin.provides[kind]))}"
            for kind in HOOK_FOR_KIND if plugin.provides.get(kind)
        )
        if plugin.status != "ok":
            provides = plugin.error or ""
        elif not provides:
            provides = f"(nothing) {plugin.summary}".strip()
        table.add_row(plugin.name, plugin.version or "-",
                      f"[{styles.get(plugin.status, '')}]{plugin.status}[/]", provides)
    Console(soft_wrap=True).print(table)
